"""Data inputs (docs/DATA.md): S3 objects served by moto over HTTP, reached
through a counting, fault-injecting forwarder, fetched into the machine's
cache and placed into the job's tree."""

from __future__ import annotations

import asyncio
import hashlib
import http.client
import os
import socket
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import boto3
import pytest
from trainyard_runner import data, retry
from trainyard_runner.data import Cache, DataError, fetch_data
from trainyard_runner.jobuser import JobUser, make_reachable
from trainyard_runner.protocol import DataFile, DataInput, DataPage

from tests.runner.test_agent import _job_states, _run_jobs, assign
from tests.support.moto import MotoServer

BUCKET = "acme-data"
WORKSPACE = "0b8a3c1e-0000-4000-8000-000000000001"


class Forwarder:
    """An HTTP server that forwards every GET to moto as it came (the
    presigned query, the Range), counting them; ``faults`` is a list of what
    the next GETs do instead: an HTTP status, or "cut" (half the body, then
    the connection closes)."""

    def __init__(self, target: str) -> None:
        self.target = urlsplit(target).netloc
        self.requests: list[tuple[str, str | None]] = []  # (path, Range)
        self.faults: list[int | str] = []
        self._lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"

    def url(self, presigned: str) -> str:
        parts = urlsplit(presigned)
        return f"{self.base}{parts.path}?{parts.query}"

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        state = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                with state._lock:
                    state.requests.append((self.path.split("?")[0], self.headers.get("Range")))
                    fault = state.faults.pop(0) if state.faults else None
                if isinstance(fault, int):
                    self.send_response(fault)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                conn = http.client.HTTPConnection(state.target, timeout=30)
                headers = {"Host": state.target, **({"Range": r} if (r := self.headers.get("Range")) else {})}
                conn.request("GET", self.path, headers=headers)
                resp = conn.getresponse()
                body = resp.read()
                self.send_response(resp.status)
                for name in ("ETag", "Content-Range", "Content-Type"):
                    if resp.getheader(name):
                        self.send_header(name, resp.getheader(name) or "")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if fault == "cut":
                    self.wfile.write(body[: len(body) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.wfile.write(body)

        return Handler


@pytest.fixture
def s3(moto_server: MotoServer) -> Iterator[Any]:
    moto_server.reset()
    moto_server.activate()
    try:
        client = boto3.client("s3", region_name="us-east-1")
        client.create_bucket(Bucket=BUCKET)
        yield client
    finally:
        moto_server.deactivate()


@pytest.fixture
def forwarder(moto_server: MotoServer) -> Iterator[Forwarder]:
    fwd = Forwarder(moto_server.url)
    threading.Thread(target=fwd.server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    yield fwd
    fwd.server.shutdown()


@pytest.fixture(autouse=True)
def _small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    # A 200 kB object is fetched in four ranged GETs; a retry that got 1 kB further counts as progress.
    monkeypatch.setattr(data, "PART", 64 << 10)
    monkeypatch.setattr(data, "CHUNK", 1 << 10)


def _listed(s3: Any, fwd: Forwarder, prefix: str, *, path: str = "data/train", read_only: bool = True) -> DataInput:
    """The input ``s3://BUCKET/<prefix>`` as the server would list it."""
    files = []
    for obj in s3.list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"]:
        etag = obj["ETag"].strip('"')
        url = s3.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": obj["Key"]}, ExpiresIn=900)
        ident = f"{WORKSPACE}|anonymous|{BUCKET}|{obj['Key']}|{etag}|{obj['Size']}"
        files.append(
            DataFile(
                path=obj["Key"][len(prefix) :],
                size=obj["Size"],
                url=fwd.url(url),
                etag=etag,
                identity=hashlib.sha256(ident.encode()).hexdigest(),
            )
        )
    files.sort(key=lambda f: f.path)
    snapshot = hashlib.sha256("".join(f"{f.path}\0{f.identity}\n" for f in files).encode()).hexdigest()
    uri = f"s3://{BUCKET}/{prefix}"
    return DataInput(
        uri=uri,
        path=path,
        snapshot=snapshot,
        file_count=len(files),
        total_size=sum(f.size for f in files),
        read_only=read_only,
        files=files,
    )


def _pages(*inputs: DataInput, size: int = 50) -> Any:
    """The server's ``…/data/?path=&after=`` for ``inputs``: pages of ``size`` files."""
    by_path = {i.path: i.files for i in inputs}

    def page(path: str, after: str) -> DataPage:
        files = [f for f in by_path[path] if not after or f.path > after][:size]
        last = files[-1].path if len(files) == size else ""
        return DataPage(path=path, files=files, next=last)

    return page


def _assigned(item: DataInput) -> DataInput:
    return item.model_copy(update={"files": []})


def _fetch(
    work: Path, cache: Path, *inputs: DataInput, fresh: Any = None, user: JobUser | None = None
) -> tuple[list[str], data.Hold]:
    reasons: list[str] = []

    async def report(reason: str) -> None:
        reasons.append(reason)

    work.mkdir(parents=True, exist_ok=True)
    hold = asyncio.run(
        fetch_data(
            [_assigned(i) for i in inputs],
            work,
            cache_root=cache,
            page=_pages(*inputs),
            fresh_url=fresh,
            report=report,
            user=user,
        )
    )
    return reasons, hold


def _put_dataset(s3: Any, prefix: str, count: int) -> dict[str, bytes]:
    contents = {f"{prefix}{i:03d}/part.bin": os.urandom(100 + i * 37) for i in range(count)}
    contents[f"{prefix}big.bin"] = os.urandom(200_000)  # fetched by ranges
    contents[f"{prefix}empty"] = b""
    for key, body in contents.items():
        s3.put_object(Bucket=BUCKET, Key=key, Body=body)
    return contents


def test_200_files_land_byte_identical_and_a_second_job_reads_nothing_from_the_network(
    tmp_path: Path, s3: Any, forwarder: Forwarder
) -> None:
    contents = _put_dataset(s3, "imagenet/", 200)
    item = _listed(s3, forwarder, "imagenet/")
    cache = tmp_path / "runner" / "data"

    reasons, hold = _fetch(tmp_path / "job1", cache, item)
    hold.release()

    placed = tmp_path / "job1" / "data" / "train"
    for key, body in contents.items():
        assert (placed / key.removeprefix("imagenet/")).read_bytes() == body
    assert reasons[0] == "fetching data s3://acme-data/imagenet/ (202 files, 956.3 kB; 0 cached)"
    assert len(forwarder.requests) == 201 + 4  # one GET per small file, four ranges of big.bin
    assert sorted(r for p, r in forwarder.requests if p.endswith("big.bin")) == [
        "bytes=0-65535",
        "bytes=131072-196607",
        "bytes=196608-199999",
        "bytes=65536-131071",
    ]
    assert not list(tmp_path.rglob("*.partial")) and not list(tmp_path.rglob("*trainyard-partial*"))
    assert Cache(cache).cached() == [item.snapshot]
    # Read-only: the job's files are the cache's, linked, and nobody may write them.
    assert (placed / "big.bin").stat().st_nlink == 2 and (placed / "big.bin").stat().st_mode & 0o777 == 0o444

    forwarder.requests.clear()
    reasons, hold = _fetch(tmp_path / "job2", cache, item)
    hold.release()

    assert forwarder.requests == []
    assert reasons == ["fetching data s3://acme-data/imagenet/ (202 files, 956.3 kB; 202 cached)"]
    assert (tmp_path / "job2" / "data" / "train" / "big.bin").read_bytes() == contents["imagenet/big.bin"]


def test_an_input_that_is_not_read_only_is_a_copy_the_job_may_change(
    tmp_path: Path, s3: Any, forwarder: Forwarder
) -> None:
    s3.put_object(Bucket=BUCKET, Key="vocab/words.txt", Body=b"alpha\n")
    item = _listed(s3, forwarder, "vocab/", path="vocab", read_only=False)

    _, hold = _fetch(tmp_path / "job", tmp_path / "data", item)
    hold.release()

    copy = tmp_path / "job" / "vocab" / "words.txt"
    copy.write_bytes(b"changed\n")
    assert copy.stat().st_nlink == 1
    cached = Cache(tmp_path / "data").path_of(item.files[0].identity)
    assert cached.read_bytes() == b"alpha\n"


def test_an_object_changed_after_the_listing_fails_the_input_and_places_nothing(
    tmp_path: Path, s3: Any, forwarder: Forwarder
) -> None:
    _put_dataset(s3, "ds/", 5)
    item = _listed(s3, forwarder, "ds/")
    s3.put_object(Bucket=BUCKET, Key="ds/003/part.bin", Body=b"a new version")

    with pytest.raises(DataError) as e:
        _fetch(tmp_path / "job", tmp_path / "data", item)

    assert str(e.value).startswith(
        "could not fetch input s3://acme-data/ds/003/part.bin: changed since the run listed it (ETag "
    )
    assert not (tmp_path / "job" / "data" / "train").exists()
    assert not list(tmp_path.rglob("*partial*"))
    assert Cache(tmp_path / "data").cached() == []


def test_an_https_pin_that_does_not_match_fails_naming_the_url_and_both_digests(
    tmp_path: Path, s3: Any, forwarder: Forwarder
) -> None:
    s3.put_object(Bucket=BUCKET, Key="vocab.txt", Body=b"words\n")
    listed = _listed(s3, forwarder, "vocab.txt", path="vocab.txt")
    item = listed.model_copy(
        update={
            "uri": "https://example.com/vocab.txt",
            "files": [listed.files[0].model_copy(update={"sha256": "ab" * 32})],
        }
    )

    with pytest.raises(DataError) as e:
        _fetch(tmp_path / "job", tmp_path / "data", item)

    got = hashlib.sha256(b"words\n").hexdigest()
    assert str(e.value) == (
        f"could not fetch input https://example.com/vocab.txt: sha256 mismatch: got {got}, expected {'ab' * 32}"
    )
    assert not (tmp_path / "job" / "vocab.txt").exists()


def test_an_input_larger_than_the_free_disk_fails_before_any_download_with_both_sizes(
    tmp_path: Path, s3: Any, forwarder: Forwarder
) -> None:
    s3.put_object(Bucket=BUCKET, Key="huge/a", Body=b"x")
    listed = _listed(s3, forwarder, "huge/")
    item = listed.model_copy(update={"files": [listed.files[0].model_copy(update={"size": 212 * 10**15})]})

    with pytest.raises(DataError) as e:
        _fetch(tmp_path / "job", tmp_path / "data", item)

    st = os.statvfs(tmp_path)
    free = st.f_bavail * st.f_frsize
    assert str(e.value) == f"input s3://acme-data/huge/ needs 212000000.0 GB more; the machine has {data.gb(free)} free"
    assert forwarder.requests == []


def test_the_disk_is_checked_for_every_input_before_any_is_downloaded(
    tmp_path: Path, s3: Any, forwarder: Forwarder
) -> None:
    s3.put_object(Bucket=BUCKET, Key="small/a", Body=b"x" * 10)
    s3.put_object(Bucket=BUCKET, Key="huge/a", Body=b"y")
    small = _listed(s3, forwarder, "small/", path="small")
    listed = _listed(s3, forwarder, "huge/", path="huge", read_only=False)
    huge = listed.model_copy(update={"files": [listed.files[0].model_copy(update={"size": 10**18})]})

    with pytest.raises(DataError) as e:
        _fetch(tmp_path / "job", tmp_path / "data", small, huge)

    free = data.gb(os.statvfs(tmp_path).f_bavail * os.statvfs(tmp_path).f_frsize)
    assert str(e.value) == (
        f"inputs s3://acme-data/small/, s3://acme-data/huge/ need 2000000000.0 GB more; the machine has {free} free"
    )
    assert forwarder.requests == []  # not even the small one, listed first
    assert not (tmp_path / "job" / "small").exists()


def test_a_path_outside_the_working_directory_is_refused_before_any_download(
    tmp_path: Path, s3: Any, forwarder: Forwarder
) -> None:
    s3.put_object(Bucket=BUCKET, Key="one/a", Body=b"x")
    item = _listed(s3, forwarder, "one/", path="../elsewhere")

    with pytest.raises(
        DataError, match=r"^could not place input s3://acme-data/one/ at \.\./elsewhere: the path is outside"
    ):
        _fetch(tmp_path / "job", tmp_path / "data", item)

    assert forwarder.requests == [] and not (tmp_path / "elsewhere").exists()


def test_a_link_refused_with_403_is_replaced_by_a_fresh_one(tmp_path: Path, s3: Any, forwarder: Forwarder) -> None:
    s3.put_object(Bucket=BUCKET, Key="one/a.bin", Body=b"abc" * 1000)
    item = _listed(s3, forwarder, "one/")
    asked: list[tuple[str, str]] = []

    def fresh(path: str, file: str) -> str:
        asked.append((path, file))
        return item.files[0].url

    forwarder.faults = [403]
    _, hold = _fetch(tmp_path / "job", tmp_path / "data", item, fresh=fresh)
    hold.release()

    assert asked == [("data/train", "a.bin")]
    assert (tmp_path / "job" / "data" / "train" / "a.bin").read_bytes() == b"abc" * 1000


def test_an_interrupted_download_is_retried_and_resumes_where_it_was(
    tmp_path: Path, s3: Any, forwarder: Forwarder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(retry, "FIRST_PAUSE", 0.01)
    body = os.urandom(50_000)
    s3.put_object(Bucket=BUCKET, Key="one/a.bin", Body=body)
    item = _listed(s3, forwarder, "one/")

    forwarder.faults = [503, "cut"]
    _, hold = _fetch(tmp_path / "job", tmp_path / "data", item)
    hold.release()

    assert (tmp_path / "job" / "data" / "train" / "a.bin").read_bytes() == body
    ranges = [r for _, r in forwarder.requests]
    assert ranges[:2] == [None, None] and ranges[2] is not None and ranges[2].startswith("bytes=")
    assert ranges[2] != "bytes=0-49999"  # resumed after what the cut response had delivered


def test_eviction_keeps_the_files_of_a_held_snapshot_and_those_a_job_links_to(
    tmp_path: Path, s3: Any, forwarder: Forwarder
) -> None:
    for name in ("a", "b", "c"):
        s3.put_object(Bucket=BUCKET, Key=f"{name}/f.bin", Body=name.encode() * 100)
    held, linked, free = (_listed(s3, forwarder, f"{n}/", path=n) for n in ("a", "b", "c"))
    cache = Cache(tmp_path / "data")
    _, hold = _fetch(tmp_path / "job1", cache.root, held)
    _, done = _fetch(tmp_path / "job2", cache.root, linked, free)
    done.release()
    (tmp_path / "job1" / "a" / "f.bin").unlink()  # only the hold keeps it
    (tmp_path / "job2" / "c" / "f.bin").unlink()  # nothing keeps it

    removed = cache.evict(max_bytes=0)

    assert removed == 1
    assert cache.path_of(held.files[0].identity).exists()
    assert cache.path_of(linked.files[0].identity).exists()
    assert not cache.path_of(free.files[0].identity).exists()
    assert sorted(cache.cached()) == sorted([held.snapshot, linked.snapshot])
    hold.release()


@pytest.mark.skipif(os.geteuid() != 0, reason="a job gets a user of its own only under a root runner")
def test_the_jobs_user_reads_a_read_only_input_but_cannot_change_it_or_the_cache(
    tmp_path: Path, s3: Any, forwarder: Forwarder
) -> None:
    s3.put_object(Bucket=BUCKET, Key="ds/x/f.bin", Body=b"secret-free data")
    item = _listed(s3, forwarder, "ds/")
    uid = 64_900
    user = JobUser(uid)
    work = tmp_path / "job" / "work"
    work.mkdir(parents=True)
    os.chown(work, uid, uid)
    make_reachable(work)

    _, hold = _fetch(work, tmp_path / "runner" / "data", item, user=user)
    hold.release()

    placed = work / "data" / "train" / "x" / "f.bin"
    cached = Cache(tmp_path / "runner" / "data").path_of(item.files[0].identity)

    def as_job(script: str) -> str:
        return subprocess.run(
            ["sh", "-c", script], user=uid, group=uid, extra_groups=[], capture_output=True, text=True, check=False
        ).stdout

    assert as_job(f"cat {placed}") == "secret-free data"
    assert as_job(f"echo x >> {placed} && echo WROTE; chmod 666 {placed} && echo CHMOD") == ""
    assert as_job(f"touch {placed.parent}/new && echo ADDED; rm -f {placed} && echo REMOVED") == ""
    assert as_job(f"ls {cached.parent.parent} && echo LISTED; echo x >> {cached} && echo WROTE") == ""
    assert os.stat(work / "data").st_uid == uid  # the folders above the input are the job's
    assert cached.read_bytes() == b"secret-free data"


def _serve_data(file_server: Any, job: dict[str, Any], uri: str, path: str, files: list[DataFile]) -> str:
    """Give ``job`` (an AssignJob dict) one data input whose one page this server answers; returns its snapshot."""
    snapshot = hashlib.sha256("".join(f"{f.path}\0{f.identity}\n" for f in files).encode()).hexdigest()
    job["api_url"] = f"{file_server.base}/api/v1"
    job["data"] = [
        {"uri": uri, "path": path, "snapshot": snapshot, "file_count": len(files), "total_size": 0, "read_only": True}
    ]
    page = DataPage(path=path, files=files)
    file_server.files[f"/api/v1/runner/jobs/{job['job']}/data/"] = page.model_dump_json().encode()
    return snapshot


def test_a_runner_places_data_before_the_commands_and_a_wrong_pin_fails_before_them(
    tmp_path: Path, repo: tuple[Path, str], file_server: Any
) -> None:
    url, size, sha = file_server.add("/vocab.txt", b"alpha\nbeta\n")
    vocab = DataFile(path="", size=size, url=url, sha256=sha, identity="1" * 64)
    job = assign("j", ["cat data/vocab.txt", "sleep 1.2"], repo)
    snapshot = _serve_data(file_server, job, "https://example.com/vocab.txt", "data/vocab.txt", [vocab])
    pinned = assign("k", ["echo never"], repo)
    wrong = vocab.model_copy(update={"sha256": "ab" * 32, "identity": "2" * 64})
    _serve_data(file_server, pinned, "https://example.com/vocab.txt", "vocab.txt", [wrong])

    server = _run_jobs(tmp_path, job, pinned)

    assert _job_states(server, "j")[:3] == [
        ("preparing", None, ""),
        ("preparing", None, "fetching data https://example.com/vocab.txt (1 file, 11 bytes; 0 cached)"),
        ("running", None, ""),
    ]
    assert [t for _, _, t in server.stored["j"]] == ["alpha", "beta"]
    assert any(m.get("data_cached") == [snapshot] for m in server.received if m["type"] == "heartbeat")
    assert _job_states(server, "k")[-1] == (
        "failed",
        None,
        f"could not fetch input https://example.com/vocab.txt: sha256 mismatch: got {sha}, expected {'ab' * 32}",
    )
    assert "running" not in [s for s, _ in server.states("k")] and "k" not in server.stored
