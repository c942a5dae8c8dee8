"""What the assignment frame no longer carries (issue 11, items 3 and 13):
no secret crosses the channel layer (Redis, written to disk with appendonly),
and an input's file list comes over REST page by page, so a 60k-file input
starts. Every command the stack sends to its Redis db is watched (MONITOR)
while the job is assigned and runs."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import redis

from tests.e2e.conftest import FINISHED, User, commit_all, run_name_of
from tests.support.stack import E2E_REDIS_DB

SECRET = "PlainProbe0xC0FFEE77redisWatch"
PROBE = """workflows:
  - name: probe
    provider: bash
    secrets: [PROBE_SECRET]
    commands:
      - printf '%s' "$PROBE_SECRET" | sha256sum | cut -c1-64
"""
FILES = 60_000
MANY = """workflows:
  - name: produce
    provider: bash
    commands:
      - mkdir -p data && printf x > data/seed.txt
    artifacts: [./data]
  - name: count
    provider: bash
    commands:
      - find data -type f | wc -l
      - cat data/shard-007/sample-0007123.txt
    deps: [{tag: sixty-thousand}]
"""
ADD_FILES = """
import hashlib
from backend.artifacts.models import Artifact, ArtifactFile
from backend.runs.models import Run
run = Run.objects.get(name={run!r}, workspace__slug={slug!r})
artifact = Artifact.stored.get(job__run=run, path="./data")
sha = hashlib.sha256(b"x").hexdigest()
key = artifact.storage_prefix + "/seed.txt"
ArtifactFile.objects.bulk_create(
    (ArtifactFile(artifact=artifact, path=f"shard-{{i // 1000:03}}/sample-{{i:07}}.txt", size=1, sha256=sha, key=key)
     for i in range({n})),
    batch_size=5000,
)
print(artifact.files.count())
"""


class Watched:
    """Every command sent to the stack's Redis db while watching."""

    def __init__(self) -> None:
        self.commands: list[str] = []

    def containing(self, text: str) -> list[str]:
        return [c for c in self.commands if text in c]


@contextmanager
def watching(redis_url: str) -> Iterator[Watched]:
    watched = Watched()
    client = redis.Redis.from_url(redis_url, socket_timeout=5)
    stop = threading.Event()
    started = threading.Event()

    def listen() -> None:
        with client.monitor() as monitor:
            started.set()
            while not stop.is_set():
                try:
                    command = monitor.next_command()
                except redis.exceptions.TimeoutError:
                    continue
                if command.get("db") == E2E_REDIS_DB:
                    watched.commands.append(str(command.get("command", "")))

    thread = threading.Thread(target=listen, daemon=True)
    thread.start()
    started.wait(10)
    try:
        yield watched
    finally:
        stop.set()
        thread.join(15)
        client.close()


def _stored_values(redis_url: str) -> bytes:
    """Every key and value left in the stack's Redis db, dumped."""
    client = redis.Redis.from_url(redis_url, socket_timeout=10)
    out = []
    for key in client.scan_iter(count=1000):
        out.append(key)
        out.append(client.dump(key) or b"")
    return b"\n".join(out)


def _set_secret(user: User, repo: Path, name: str, value: str) -> None:
    done = user.cli(repo, "secrets", "set", name, input=value + "\n")
    assert done.returncode == 0, done.stderr


def test_a_secret_never_reaches_the_channel_layer_and_the_job_still_has_it(alice: User, repo: Path) -> None:
    _set_secret(alice, repo, "PROBE_SECRET", SECRET)
    (repo / ".trainyard" / "workflows.yaml").write_text(PROBE)
    commit_all(repo, "probe")
    try:
        with watching(alice.stack.redis_url) as watched:
            followed = alice.cli(repo, "run", "probe")
        left = _stored_values(alice.stack.redis_url)
    finally:
        alice.cli(repo, "secrets", "rm", "PROBE_SECRET")

    assert followed.returncode == 0, followed.stderr
    assert hashlib.sha256(SECRET.encode()).hexdigest() in followed.stdout  # the job saw the value
    assert watched.containing("assign_job"), "the assignment was not seen crossing Redis"
    assert watched.containing(SECRET) == []
    assert SECRET.encode() not in left


@pytest.mark.timeout(600)
def test_an_input_of_60k_files_starts_the_job_with_a_small_assignment(alice: User, repo: Path) -> None:
    (repo / ".trainyard" / "workflows.yaml").write_text(MANY)
    commit_all(repo, "many files")
    produced = alice.cli(repo, "run", "produce")
    assert produced.returncode == 0, produced.stderr
    name = produced.stderr.split("Run ", 1)[1].split()[0]
    added = alice.stack.manage("shell", "-c", ADD_FILES.format(run=name, slug=alice.workspace, n=FILES))
    assert added.strip().splitlines()[-1] == str(FILES + 1)
    assert alice.cli(repo, "tag", "add", "sixty-thousand", name).returncode == 0
    try:
        # Watched until the runner took the job: the assignment has crossed Redis by then.
        with watching(alice.stack.redis_url) as watched:
            counting = run_name_of(alice.cli(repo, "run", "count", "-d"))
            alice.wait(counting, lambda r: r["jobs"][0]["status"] not in ("pending", "assigned"), timeout=120)
        finished = alice.wait(counting, lambda r: r["status"] in FINISHED, timeout=420)
        logs = alice.cli(repo, "logs", counting)
    finally:
        alice.cli(repo, "tag", "rm", "sixty-thousand")

    assignments = watched.containing("assign_job")
    assert finished["status"] == "succeeded", finished
    assert logs.stdout.split() == [str(FILES + 1), "x"]
    assert assignments and max(len(c) for c in assignments) < 16 * 1024
