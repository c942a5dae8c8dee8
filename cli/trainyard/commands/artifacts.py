"""``trainyard artifacts``: list a run's artifacts and download them, each
file checked against its manifest's size and sha256; several at once, and a
cut-off download continued where it stopped."""

from __future__ import annotations

import fnmatch
import os
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import click

from ..api import ApiError, Artifact, ArtifactFile, Client, Export
from ..code import file_sha256, keep_out_of_git
from ..output import export_lines, print_table, size
from ..progress import Bar, Transfers, transfers
from . import common, completers, options


@click.group(cls=common.Group)
def artifacts() -> None:
    """List and download the artifacts of a run."""


@artifacts.command("list")
@click.argument("run_name", metavar="RUN", shell_complete=completers.runs)
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
@click.argument("run_name", metavar="RUN", shell_complete=completers.runs)
@click.option(
    "-o",
    "--output",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("."),
    show_default=True,
    help="Directory to write into.",
)
@click.option(
    "--path",
    "patterns",
    multiple=True,
    metavar="PATTERN",
    help="Only the files whose <artifact>/<file> path matches PATTERN (a glob, or a folder); repeatable.",
)
@click.option(
    "-j", "--parallel", type=click.IntRange(1, 16), default=4, show_default=True, help="Files downloaded at once."
)
def artifacts_download(run_name: str, out_dir: Path, patterns: tuple[str, ...], parallel: int) -> None:
    """Download the files of RUN's artifacts to OUTPUT/<artifact>/<file>,
    checking each file's size and sha256.

    A file already there with the right sha256 is kept; a download that was
    cut off continues where it stopped (the part is kept beside the file as
    <file>.trainyard-part), so running it again finishes the rest. Progress
    bars show on a terminal (stderr).

    Inside a git working tree, the files are added to the repo's
    .git/info/exclude, so they do not change the code your next runs ship
    (and their cache keys)."""
    api = common.client()
    found = api.list_artifacts(run_name)
    incomplete = [a for a in found if a["status"] != "complete"]
    for artifact in incomplete:
        common.warn(f"artifact {artifact['path']} is still {artifact['status']}; skipped")
    root = out_dir.resolve()
    wanted = [
        (artifact, entry, _safe_destination(root, artifact["path"], entry["path"]))
        for artifact in found
        if artifact["status"] == "complete"
        for entry in artifact["files"]
    ]
    if patterns:
        wanted = [w for w in wanted if _matches(w[2].relative_to(root).as_posix(), patterns)]
        if not wanted:
            raise common.CliError(f"no file of run {run_name}'s artifacts matches {', '.join(patterns)}")
    count, total, written = 0, 0, []
    try:
        with transfers() as shown, ThreadPoolExecutor(max_workers=parallel) as pool:
            label = f"{len(wanted)} file{'s' * (len(wanted) != 1)}"
            everything = shown.bar(label, sum(entry["size"] for _, entry, _ in wanted))
            futures = [pool.submit(_download_file, api, shown, everything, *w) for w in wanted]
            try:
                for future in as_completed(futures):
                    done = future.result()
                    click.echo(f"{common.display_path(done.dest)}  {size(done.size)}{done.note}")
                    count, total = count + 1, total + done.size
                    written.append(done.dest)
            finally:
                for future in futures:
                    future.cancel()
    finally:
        _keep_out_of_code(out_dir, written)
    click.echo(f"Downloaded {count} file{'s' * (count != 1)} ({size(total)}) to {out_dir}", err=True)
    if incomplete:
        raise common.CliError(
            f"{len(incomplete)} artifact(s) of run {run_name} are not complete yet; try again when the run has finished"
        )


@dataclass(frozen=True)
class Downloaded:
    dest: Path
    size: int
    note: str  # "" (downloaded), "  (already here)", "  (continued after 1.0 MiB)"


def _download_file(
    api: Client, shown: Transfers, everything: Bar, artifact: Artifact, entry: ArtifactFile, dest: Path
) -> Downloaded:
    """One file to ``dest`` through ``dest``.trainyard-part, continuing the
    part a cut-off download left; checked against the manifest. Its bytes
    count on a bar of its own and on ``everything``."""
    expected, name = (entry["size"], entry["sha256"]), f"{artifact['path']}/{entry['path']}"
    if dest.is_file() and dest.stat().st_size == entry["size"] and file_sha256(dest) == entry["sha256"]:
        everything.advance(entry["size"])
        return Downloaded(dest, entry["size"], "  (already here)")
    dest.parent.mkdir(parents=True, exist_ok=True)
    partial = dest.with_name(dest.name + ".trainyard-part")
    if partial.is_file() and partial.stat().st_size >= entry["size"]:
        if (partial.stat().st_size, file_sha256(partial)) == expected:
            os.replace(partial, dest)
            everything.advance(entry["size"])
            return Downloaded(dest, entry["size"], "")
        partial.unlink()
    bar = shown.bar(PurePosixPath(entry["path"]).name, entry["size"])

    def count(nbytes: int) -> None:
        bar.advance(nbytes)
        everything.advance(nbytes)

    try:
        count(partial.stat().st_size if partial.is_file() else 0)
        written, digest, resumed = api.fetch_artifact_file(artifact["id"], entry["path"], partial, on_bytes=count)
    finally:
        bar.done()
    if (written, digest) != expected:
        partial.unlink()
        raise common.CliError(
            f"{name}: downloaded {written} bytes with sha256 "
            f"{digest}, but the manifest says {entry['size']} bytes with sha256 {entry['sha256']}"
        )
    os.replace(partial, dest)
    return Downloaded(dest, written, f"  (continued after {size(resumed)})" if resumed else "")


def _matches(relative: str, patterns: tuple[str, ...]) -> bool:
    """``relative`` (<artifact>/<file> as written under OUTPUT) matches a
    glob of ``patterns``, or lies in a folder one names."""
    for pattern in patterns:
        clean = pattern.strip().removeprefix("./").rstrip("/")
        if fnmatch.fnmatchcase(relative, clean) or relative.startswith(clean + "/"):
            return True
    return False


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
