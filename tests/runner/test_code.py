from __future__ import annotations

import asyncio
import io
import subprocess
import tarfile
import threading
from collections.abc import Callable, Iterator
from functools import partial
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
from trainyard_runner.code import CodeError, mirror_path, prepare_code, safe_extract, spare_checkout, spare_path
from trainyard_runner.protocol import CodeSpec


@pytest.fixture
def files_url(tmp_path: Path) -> Iterator[tuple[Path, str]]:
    """An HTTP server on 127.0.0.1 serving tmp_path/served; returns (dir, base url)."""
    served = tmp_path / "served"
    served.mkdir()
    handler = partial(SimpleHTTPRequestHandler, directory=str(served))
    handler.log_message = lambda *a: None  # type: ignore[attr-defined]
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield served, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def _prepare(code: CodeSpec, tmp_path: Path, name: str = "work") -> Path:
    work = tmp_path / name
    tmp = tmp_path / f"{name}-tmp"
    tmp.mkdir()
    asyncio.run(prepare_code(code, work=work, cache_dir=tmp_path / "cache", tmp_dir=tmp))
    return work


def test_git_checks_out_the_commit_and_applies_a_binary_patch_with_a_new_file(
    tmp_path: Path, repo: tuple[Path, str], files_url: tuple[Path, str], git: Callable[..., str]
) -> None:
    path, commit = repo
    (path / "train.py").write_text("print('v2')\n")
    (path / "weights.bin").write_bytes(bytes(range(256)) * 4)
    git(path, "add", "-A")  # staged only to make the patch: the commit stays the same
    served, base = files_url
    patch = subprocess.run(
        ["git", "-C", str(path), "diff", "--cached", "--binary", "HEAD"], capture_output=True, check=True
    )
    (served / "p.patch").write_bytes(patch.stdout)
    code = CodeSpec(kind="git", repo_url=str(path), commit=commit, patch_url=f"{base}/p.patch")

    work = _prepare(code, tmp_path)

    assert (work / "train.py").read_text() == "print('v2')\n"
    assert (work / "weights.bin").read_bytes() == bytes(range(256)) * 4
    assert git(work, "rev-parse", "HEAD") == commit
    assert mirror_path(tmp_path / "cache", str(path)).is_dir()


def test_git_fetches_a_commit_the_cached_mirror_does_not_have(
    tmp_path: Path, repo: tuple[Path, str], git: Callable[..., str]
) -> None:
    path, first = repo
    _prepare(CodeSpec(kind="git", repo_url=str(path), commit=first), tmp_path, "w1")
    (path / "train.py").write_text("print('v3')\n")
    git(path, "commit", "-qam", "second")
    second = git(path, "rev-parse", "HEAD")

    work = _prepare(CodeSpec(kind="git", repo_url=str(path), commit=second), tmp_path, "w2")

    assert (work / "train.py").read_text() == "print('v3')\n"


def test_the_next_job_takes_the_spare_clone_made_after_the_last_one_instead_of_cloning(
    tmp_path: Path, repo: tuple[Path, str], git: Callable[..., str]
) -> None:
    """A warm runner starts a job without a clone: the spare made when the
    last job ended is renamed into the new job's folder and checked out at
    its commit (a newer one than the spare was made with: fetched)."""
    path, first = repo
    cache = tmp_path / "cache"
    _prepare(CodeSpec(kind="git", repo_url=str(path), commit=first), tmp_path, "w1")
    spare = spare_path(mirror_path(cache, str(path)))
    assert not spare.exists()
    asyncio.run(spare_checkout(CodeSpec(kind="git", repo_url=str(path), commit=first), cache_dir=cache))
    assert spare.is_dir()
    (spare / "made-ahead").write_text("")  # marks this very folder (git ignores nothing here: untracked)
    (path / "train.py").write_text("print('v4')\n")
    git(path, "commit", "-qam", "fourth")
    second = git(path, "rev-parse", "HEAD")

    work = _prepare(CodeSpec(kind="git", repo_url=str(path), commit=second), tmp_path, "w2")

    assert (work / "made-ahead").exists() and not spare.exists()
    assert (work / "train.py").read_text() == "print('v4')\n"
    assert git(work, "rev-parse", "HEAD") == second
    assert git(work, "status", "--porcelain", "--untracked-files=no") == ""
    # Made again for the job after; a second call while one is there changes nothing.
    for _ in range(2):
        asyncio.run(spare_checkout(CodeSpec(kind="git", repo_url=str(path), commit=second), cache_dir=cache))
    assert spare.is_dir() and not (spare / "made-ahead").exists()
    assert sorted(p.name for p in cache.iterdir()) == sorted([mirror_path(cache, str(path)).name, spare.name])


def test_no_spare_is_made_for_an_archive_or_a_repository_without_a_mirror(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    asyncio.run(spare_checkout(CodeSpec(kind="archive", archive_url="http://127.0.0.1:9/x.tgz"), cache_dir=cache))
    asyncio.run(
        spare_checkout(CodeSpec(kind="git", repo_url=str(tmp_path / "nowhere"), commit="a" * 40), cache_dir=cache)
    )
    assert not cache.exists() or not any(cache.iterdir())


def test_a_patch_that_does_not_apply_fails_with_gits_reason(
    tmp_path: Path, repo: tuple[Path, str], files_url: tuple[Path, str], git: Callable[..., str]
) -> None:
    path, commit = repo
    served, base = files_url
    (served / "bad.patch").write_text(
        "diff --git a/train.py b/train.py\n--- a/train.py\n+++ b/train.py\n@@ -1 +1 @@\n-print('other')\n+print('x')\n"
    )
    with pytest.raises(CodeError) as e:
        _prepare(CodeSpec(kind="git", repo_url=str(path), commit=commit, patch_url=f"{base}/bad.patch"), tmp_path)
    assert str(e.value).startswith("git apply of the patch failed (exit 1): ")
    assert "patch does not apply" in str(e.value)


def test_an_unknown_repository_fails_with_the_clone_error(tmp_path: Path) -> None:
    with pytest.raises(CodeError) as e:
        _prepare(CodeSpec(kind="git", repo_url=str(tmp_path / "nope"), commit="a" * 40), tmp_path)
    assert str(e.value).startswith(f"clone of {tmp_path / 'nope'} failed (exit 128): ")


def _tar(members: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_archive_is_downloaded_and_extracted(tmp_path: Path, files_url: tuple[Path, str]) -> None:
    served, base = files_url
    (served / "code.tar.gz").write_bytes(_tar({"train.py": b"print(1)\n", "pkg/m.py": b""}))

    work = _prepare(CodeSpec(kind="archive", archive_url=f"{base}/code.tar.gz"), tmp_path)

    assert sorted(p.relative_to(work).as_posix() for p in work.rglob("*")) == ["pkg", "pkg/m.py", "train.py"]


@pytest.mark.parametrize("name", ["../evil", "a/../../evil", "/tmp/evil"])
def test_archive_extraction_refuses_paths_outside_the_work_dir(tmp_path: Path, name: str) -> None:
    archive = tmp_path / "a.tar.gz"
    archive.write_bytes(_tar({"ok.txt": b"1", name: b"x"}))
    dest = tmp_path / "dest"
    dest.mkdir()
    with pytest.raises(CodeError, match="points outside the working directory"):
        safe_extract(archive, dest)
    assert list(dest.iterdir()) == []
    assert not (tmp_path / "evil").exists()


@pytest.fixture
def echoing_403() -> Iterator[str]:
    """A server that refuses every GET with 403 and quotes the request's path
    and query in the body, as some servers do; returns its base url."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            body = f"no access to {self.path}".encode()
            self.send_response(403)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_a_failed_download_names_no_part_of_the_signed_url(
    tmp_path: Path, repo: tuple[Path, str], echoing_403: str
) -> None:
    path, commit = repo
    token = ".eJyrVkrOz8lJTVWyUlJKyUxXKi1OLQIAQKkGhQ:1u9Zk2:Gv3Hs7F0x6tM0QYw1k2l3m4n5o6p7q8r9s0t1u2v3w"
    patch_url = f"{echoing_403}/storage/{token}"
    archive_url = f"{echoing_403}/bucket/code.tar.gz?X-Amz-Signature=0123abcd&X-Amz-Expires=900"

    with pytest.raises(CodeError) as patch:
        _prepare(CodeSpec(kind="git", repo_url=str(path), commit=commit, patch_url=patch_url), tmp_path, "w1")
    with pytest.raises(CodeError) as archive:
        _prepare(CodeSpec(kind="archive", archive_url=archive_url), tmp_path, "w2")

    assert (
        str(patch.value) == f"download of the patch failed: GET {echoing_403}/… (signed URL): HTTP 403 no access to …"
    )
    assert str(archive.value) == (
        f"download of the archive failed: GET {echoing_403}/… (signed URL): HTTP 403 no access to …?…"
    )


def test_a_commit_or_url_that_would_be_an_option_is_refused_before_git_runs(tmp_path: Path) -> None:
    for code, words in [
        (
            CodeSpec(kind="git", repo_url="https://example.com/r.git", commit="--upload-pack=touch /tmp/x"),
            "not a git object name",
        ),
        (CodeSpec(kind="git", repo_url="--upload-pack=touch /tmp/x", commit="a" * 40), "starts with '-'"),
    ]:
        with pytest.raises(CodeError, match=words):
            asyncio.run(prepare_code(code, work=tmp_path / "w", cache_dir=tmp_path / "c", tmp_dir=tmp_path / "t"))


def test_git_runs_without_the_runner_token_and_only_with_plain_transports(monkeypatch: pytest.MonkeyPatch) -> None:
    from trainyard_runner import code

    monkeypatch.setenv("TRAINYARD_RUNNER_TOKEN", "secret")
    status, printed = asyncio.run(code._run(["sh", "-c", "env >&2"], 5))  # what git would get
    assert status == 0
    assert "TRAINYARD_RUNNER_TOKEN" not in printed
    assert "GIT_ALLOW_PROTOCOL=file:git:http:https:ssh" in printed.splitlines()


def test_an_ext_transport_url_is_refused_by_git(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    spec = CodeSpec(kind="git", repo_url=f"ext::sh -c touch% {marker}", commit="a" * 40)
    with pytest.raises(CodeError, match="clone of ext::"):
        asyncio.run(prepare_code(spec, work=tmp_path / "w", cache_dir=tmp_path / "c", tmp_dir=tmp_path / "t"))
    assert not marker.exists()
