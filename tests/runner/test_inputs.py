"""Input artifacts: fetched from signed urls into the working directory, verified, retried."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest
from trainyard_runner import inputs, retry
from trainyard_runner.inputs import InputError, describe, fetch_inputs, fetch_manifests, plan
from trainyard_runner.protocol import InputArtifact, InputFile, InputPage


@pytest.fixture(autouse=True)
def _small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    # Many reads per file; a retry that got 1000 bytes further counts as progress.
    monkeypatch.setattr(inputs, "CHUNK", 1000)


def _file(server: Any, url_path: str, rel: str, data: bytes, **override: Any) -> InputFile:
    url, size, sha = server.add(url_path, data)
    return InputFile(**{"path": rel, "size": size, "sha256": sha, "url": url, **override})


def _fetch(work: Path, arts: list[InputArtifact]) -> list[str]:
    reasons: list[str] = []

    async def report(reason: str) -> None:
        reasons.append(reason)

    asyncio.run(fetch_inputs(arts, work, report=report))
    return reasons


def test_every_file_is_fetched_into_its_input_path_and_verified(tmp_path: Path, file_server: Any) -> None:
    work = tmp_path / "work"
    work.mkdir()
    weights = os.urandom(2_500_000)
    arts = [
        InputArtifact(
            path="./base_model",
            files=[
                _file(file_server, "/a/weights.bin", "weights.bin", weights),
                _file(file_server, "/a/cfg", "sub/dir/config.json", b'{"layers": 2}'),
                _file(file_server, "/a/empty", "empty", b""),
            ],
        ),
        InputArtifact(path="data", files=[_file(file_server, "/b/train", "train.txt", b"hello\n")]),
    ]

    reasons = _fetch(work, arts)

    assert (work / "base_model" / "weights.bin").read_bytes() == weights
    assert (work / "base_model" / "sub" / "dir" / "config.json").read_bytes() == b'{"layers": 2}'
    assert (work / "base_model" / "empty").read_bytes() == b""
    assert (work / "data" / "train.txt").read_text() == "hello\n"
    assert reasons == ["fetching inputs (4 files, 2.5 MB)"]
    assert not list(work.rglob("*.partial"))
    # The signed url is used as given, and no token is sent anywhere.
    assert [r for r, _ in file_server.requests] == ["/a/weights.bin", "/a/cfg", "/a/empty", "/b/train"]


def test_a_wrong_digest_fails_with_the_file_named_and_leaves_nothing_behind(tmp_path: Path, file_server: Any) -> None:
    arts = [
        InputArtifact(path="./base_model", files=[_file(file_server, "/w", "weights.json", b"{}", sha256="0" * 64)])
    ]
    with pytest.raises(InputError) as e:
        _fetch(tmp_path, arts)
    assert str(e.value) == "could not fetch input ./base_model/weights.json: sha256 mismatch"
    assert list((tmp_path / "base_model").iterdir()) == []
    assert len(file_server.requests) == 1  # a mismatch is not retried


def test_a_body_larger_than_announced_fails(tmp_path: Path, file_server: Any) -> None:
    arts = [InputArtifact(path="m", files=[_file(file_server, "/w", "w.bin", b"x" * 5000, size=10)])]
    with pytest.raises(
        InputError, match=r"^could not fetch input m/w.bin: size mismatch: more than the expected 10 bytes$"
    ):
        _fetch(tmp_path, arts)


@pytest.mark.parametrize(
    ("path", "rel"),
    [("../outside", "f"), ("./m", "../../f"), ("/etc", "passwd"), ("./m", "/tmp/x"), ("./link", "f"), ("./m", "")],
)
def test_a_path_escaping_the_working_directory_is_refused_before_any_download(
    tmp_path: Path, file_server: Any, path: str, rel: str
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    (work / "link").symlink_to(tmp_path)  # a symlink in the code that points outside
    good = _file(file_server, "/ok", "ok", b"1")
    arts = [
        InputArtifact(path="./first", files=[good]),
        InputArtifact(path=path, files=[_file(file_server, "/f", rel, b"2")]),
    ]
    with pytest.raises(InputError) as e:
        _fetch(work, arts)
    expected = (
        "this runner takes no absolute paths" if path.startswith("/") else "the path is outside the working directory"
    )
    assert expected in str(e.value)
    assert str(e.value).startswith("could not fetch input ")
    assert not (work / "first").exists(), "nothing is downloaded"
    assert file_server.requests == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]


def test_an_absolute_artifact_path_is_restored_at_that_path_where_the_runner_allows_it(
    tmp_path: Path, file_server: Any
) -> None:
    """A conda env folder artifact (dstack 0.x): its dependants get it at the same absolute path."""
    import asyncio

    from trainyard_runner.inputs import fetch_inputs

    env_dir = tmp_path / "opt" / "conda-env"
    arts = [InputArtifact(path=str(env_dir), files=[_file(file_server, "/bin/py", "bin/python", b"#!py")])]
    asyncio.run(fetch_inputs(arts, tmp_path / "work", absolute_ok=True))
    assert (env_dir / "bin" / "python").read_bytes() == b"#!py"
    escaping = [InputArtifact(path=str(env_dir), files=[_file(file_server, "/x", "../../x", b"x")])]
    with pytest.raises(InputError, match="outside the working directory"):
        asyncio.run(fetch_inputs(escaping, tmp_path / "work", absolute_ok=True))


def test_5xx_and_cut_connections_are_retried_and_a_cut_download_resumes(
    tmp_path: Path, file_server: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(inputs.threading.Event, "wait", lambda self, timeout=None: self.is_set())  # no backoff sleeps
    data = os.urandom(100_000)
    f = _file(file_server, "/big", "big.bin", data)
    file_server.faults["/big"] = [503, "cut", "cut"]
    _fetch(tmp_path, [InputArtifact(path="in", files=[f])])
    assert (tmp_path / "in" / "big.bin").read_bytes() == data
    assert file_server.requests == [
        ("/big", None),  # 503
        ("/big", None),  # cut after 50,000 bytes
        ("/big", "bytes=50000-"),  # cut after another 25,000
        ("/big", "bytes=75000-"),
    ]


def test_a_4xx_fails_at_once(tmp_path: Path, file_server: Any) -> None:
    f = _file(file_server, "/gone", "x", b"1")
    file_server.faults["/gone"] = [403]
    with pytest.raises(InputError) as e:
        _fetch(tmp_path, [InputArtifact(path="in", files=[f])])
    assert str(e.value).startswith("could not fetch input in/x: GET http://127.0.0.1:")
    assert "HTTP 403" in str(e.value)
    assert "s3cr3t" not in str(e.value)  # the signature of the url never shows
    assert len(file_server.requests) == 1


def test_network_errors_give_up_once_the_retry_budget_is_spent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(inputs.threading.Event, "wait", lambda self, timeout=None: self.is_set())
    monkeypatch.setattr(retry, "RETRY_SECONDS", 0.3)
    f = InputFile(path="x", size=1, sha256=hashlib.sha256(b"1").hexdigest(), url="http://127.0.0.1:9/x?sig=s3cr3t")
    with pytest.raises(InputError, match=r"^could not fetch input in/x: GET http://127.0.0.1:9/… \(signed URL\): "):
        _fetch(tmp_path, [InputArtifact(path="in", files=[f])])


def test_the_progress_reason_counts_files_and_megabytes(tmp_path: Path) -> None:
    def art(*sizes: int) -> list[InputArtifact]:
        return [
            InputArtifact(
                path="m", files=[InputFile(path=f"f{i}", size=s, sha256="", url="") for i, s in enumerate(sizes)]
            )
        ]

    assert describe(plan(art(300_000), tmp_path)) == "fetching inputs (1 file, 0.3 MB)"
    assert describe(plan(art(1_000_000_000, 2_400_000_000), tmp_path)) == "fetching inputs (2 files, 3400 MB)"


def test_a_manifest_is_read_page_by_page_and_identical_files_are_downloaded_once(
    tmp_path: Path, file_server: Any
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    one = _file(file_server, "/same", "unused", b"same bytes")
    files = [one.model_copy(update={"path": f"d/{i:03}.txt"}) for i in range(25)]
    asked: list[tuple[str, str]] = []

    def page(path: str, after: str) -> InputPage:
        asked.append((path, after))
        start = 0 if not after else next(i for i, f in enumerate(files) if f.path == after) + 1
        chunk = files[start : start + 10]
        return InputPage(path=path, files=chunk, next=chunk[-1].path if start + 10 < len(files) else "")

    [filled] = fetch_manifests([InputArtifact(path="./in", file_count=25)], page)
    _fetch(work, [filled])

    assert asked == [("./in", ""), ("./in", "d/009.txt"), ("./in", "d/019.txt")]
    assert sorted(p.name for p in (work / "in" / "d").iterdir()) == [f"{i:03}.txt" for i in range(25)]
    assert {(work / "in" / "d" / f"{i:03}.txt").read_bytes() for i in range(25)} == {b"same bytes"}
    assert [r for r in file_server.requests if r[0] == "/same"] == [("/same", None)]


def test_a_manifest_shorter_than_announced_fails_naming_the_input() -> None:
    def page(path: str, after: str) -> InputPage:
        return InputPage(path=path, files=[], next="")

    with pytest.raises(InputError, match=r"^could not list input \./in: 0 of 3 files listed$"):
        fetch_manifests([InputArtifact(path="./in", file_count=3)], page)
