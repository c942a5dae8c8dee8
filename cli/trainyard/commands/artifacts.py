"""``trainyard artifacts``: list a run's artifacts and download them, each
file checked against its manifest's size and sha256."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import click

from ..api import ApiError, Artifact, Client, Export
from ..code import keep_out_of_git
from ..output import export_lines, print_table, size
from . import common, options


@click.group(cls=common.Group)
def artifacts() -> None:
    """List and download the artifacts of a run."""


@artifacts.command("list")
@click.argument("run_name", metavar="RUN")
@options.json_option("Print the API's artifact objects.")
def artifacts_list(run_name: str, as_json: bool) -> None:
    """List the files of RUN's artifacts."""
    api = common.client()
    found = api.list_artifacts(run_name)
    if as_json:
        common.print_json(found)
        return
    exports = _exports(api, run_name)
    rows = [
        [
            a["path"] + ("" if a["status"] == "complete" else f" ({a['status']})"),
            f["path"],
            size(f["size"]),
            f["sha256"][:12],
        ]
        for a in found
        for f in a["files"]
    ]
    if not rows:
        click.echo(f"Run {run_name} has no artifacts.", err=True)
    else:
        print_table(["ARTIFACT", "FILE", "SIZE", "SHA256"], rows, tty=sys.stdout.isatty())
    if exports:
        click.echo("\n".join(["", "Copied to (to:):", *export_lines(exports)]))


def _exports(api: Client, run_name: str) -> list[Export]:
    """The copies to ``to:`` destinations; none from a server without them (404)."""
    try:
        return api.list_exports(run_name)
    except ApiError as exc:
        if exc.status == 404:
            return []
        raise


@artifacts.command("download")
@click.argument("run_name", metavar="RUN")
@click.option(
    "-o",
    "--output",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Directory to write into.",
)
def artifacts_download(run_name: str, out_dir: Path) -> None:
    """Download every file of RUN's artifacts to OUTPUT/<artifact>/<file>,
    checking each file's size and sha256.

    Inside a git working tree, the files are added to the repo's
    .git/info/exclude, so they do not change the code your next runs ship
    (and their cache keys)."""
    api = common.client()
    found = api.list_artifacts(run_name)
    incomplete = [a for a in found if a["status"] != "complete"]
    for artifact in incomplete:
        common.warn(f"artifact {artifact['path']} is still {artifact['status']}; skipped")
    count, total, written = 0, 0, []
    try:
        for artifact in found:
            if artifact["status"] == "complete":
                for dest, nbytes in _download_artifact(api, artifact, out_dir.resolve()):
                    click.echo(f"{common.display_path(dest)}  {size(nbytes)}")
                    count, total = count + 1, total + nbytes
                    written.append(dest)
    finally:
        _keep_out_of_code(out_dir, written)
    click.echo(f"Downloaded {count} file{'s' * (count != 1)} ({size(total)}) to {out_dir}", err=True)
    if incomplete:
        raise common.CliError(
            f"{len(incomplete)} artifact(s) of run {run_name} are not complete yet; try again when the run has finished"
        )


def _download_artifact(api: Client, artifact: Artifact, root: Path) -> Iterator[tuple[Path, int]]:
    for entry in artifact["files"]:
        dest = _safe_destination(root, artifact["path"], entry["path"])
        dest.parent.mkdir(parents=True, exist_ok=True)
        partial = dest.with_name(dest.name + ".trainyard-part")
        with partial.open("wb") as out:
            written, digest = api.download_artifact_file(artifact["id"], entry["path"], out)
        if written != entry["size"] or digest != entry["sha256"]:
            partial.unlink()
            raise common.CliError(
                f"{artifact['path']}/{entry['path']}: downloaded {written} bytes with sha256 "
                f"{digest}, but the manifest says {entry['size']} bytes with sha256 {entry['sha256']}"
            )
        os.replace(partial, dest)
        yield dest, written


def _safe_destination(root: Path, artifact_path: str, file_path: str) -> Path:
    """root/<artifact path>/<file path>, refusing anything that leaves root."""
    parts = [*PurePosixPath(artifact_path).parts, *PurePosixPath(file_path).parts]
    bad = (
        any(p in ("..", "") or p.startswith("/") for p in parts)
        or PurePosixPath(artifact_path).is_absolute()
        or PurePosixPath(file_path).is_absolute()
    )
    dest = root.joinpath(*[p for p in parts if p != "."]).resolve()
    if bad or not dest.is_relative_to(root) or dest == root:
        raise common.CliError(
            f"refusing artifact file {artifact_path}/{file_path}: its path leaves the output directory"
        )
    return dest


def _keep_out_of_code(out_dir: Path, written: list[Path]) -> None:
    kept = keep_out_of_git(out_dir, written) if written else None
    if kept and kept[1]:
        exclude, lines = kept
        click.echo(
            f"Added {', '.join(lines)} to {common.display_path(exclude)}: downloads do not change your runs' code",
            err=True,
        )
