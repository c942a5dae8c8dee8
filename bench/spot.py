"""The spot part of the benchmark (bench/README.md): how long a spot
interruption notice keeps a checkpointed job from running, and how fast the
runner syncs a checkpoint next to a plain boto3 upload of the same files.

moto's server plays EC2 and S3 and tests/support/ec2boot.py each instance's
boot and metadata, as in the AWS part (bench/aws.py, whose account, boot
helper and milestones are reused). Every timestamp is this machine's
``time.time()``, so milestones from different processes subtract.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import statistics
import time
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.aws import (
    BUCKET,
    ENDED_TIMEOUT,
    REGION,
    SETTLE,
    AwsBenchError,
    TimedBoot,
    _terminate_and_wait_ended,
    cleanup,
    connect_account,
    wait_facts,
    warm_wheels,
)
from bench.lib import Api, log
from tests.support.logfill import line_time
from tests.support.moto import MotoServer
from tests.support.stack import Stack

NOTICE_AHEAD = 30.0  # the notice's T: now + 30 s (less than the runner's 45 s margin: it syncs at once)
NOTICE_JITTER = (1.0, 6.0)  # a random wait before the notice, so it lands anywhere in the runner's 5 s poll
SPOT_TIMEOUT = 300.0
SYNC_TIMEOUT = 600.0
BIG_BYTES = 500_000_000  # 500 MB (decimal MB throughout)
SMALL_COUNT, SMALL_BYTES = 1000, 100_000
IDLE_SECONDS = 600

TARGET_SPOT_OWN_S = 5.0
TARGET_SYNC_RATIO = 0.8

SPOT_JOB = f"""
  - name: spot-resume
    provider: bash
    backends: [aws]
    spot_policy: spot
    idle_duration: {IDLE_SECONDS}s
    checkpoint: ./ckpt
    resources:
      cpu: 1
      memory: 256MB
    commands:
      - 'echo "attempt $TRAINYARD_ATTEMPT: commands running"'
      - 'trap "exit 0" TERM'
      - 'mkdir -p ckpt && echo "attempt $TRAINYARD_ATTEMPT" > ckpt/state.txt'
      - 'if [ "$TRAINYARD_ATTEMPT" = 1 ]; then while true; do sleep 0.2 || true; done; fi'
      - 'echo "attempt $TRAINYARD_ATTEMPT: done"'
"""

SYNC_LAST_LINE = "checkpoint files in place"
SYNC_JOB = f"""
  - name: ckpt-sync
    provider: bash
    backends: [local]
    checkpoint: ./ckpt
    commands:
      - 'cp -al "$SYNC_SOURCE" ckpt || cp -r "$SYNC_SOURCE" ckpt'
      - 'echo "{SYNC_LAST_LINE}"'
"""


class _ReadLog(dict[str, str]):
    """An instance's metadata (``Ec2Boot.facts[id]``) that calls ``on_read``
    when the helper's IMDS hands out ``spot/instance-action``."""

    def __init__(self, facts: dict[str, str], on_read: Any) -> None:
        super().__init__(facts)
        self._on_read = on_read

    def __getitem__(self, key: str) -> str:
        value = super().__getitem__(key)
        if key == "spot/instance-action":
            self._on_read()
        return value


class NoticeBoot(TimedBoot):
    """``TimedBoot`` that also remembers when each instance's runner first
    read the spot notice from its metadata."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.notice_read: dict[str, float] = {}

    def notice(self, instance_id: str, action: str, at: float) -> None:
        def read(instance_id: str = instance_id) -> None:
            self.notice_read.setdefault(instance_id, time.time())

        self.facts[instance_id] = _ReadLog(self.facts[instance_id], read)
        super().notice(instance_id, action, at)


# --------------------------------------------------------------------- setup


def _aws_connected(database_url: str) -> bool:
    import psycopg

    with psycopg.connect(database_url) as conn:
        row = conn.execute(
            "SELECT count(*) FROM clouds_cloudaccount WHERE kind = 'aws' AND config->'facts'->>'refreshed_at' IS NOT NULL"
        ).fetchone()
    return bool(row and row[0])


def ensure_account(api: Api, stack: Stack, moto: MotoServer) -> dict[str, Any]:
    """The AWS part's account (and wheelhouse), unless that part already connected it."""
    wheels_s = warm_wheels(stack)
    if _aws_connected(stack.database_url):
        return {"wheelhouse_s": round(wheels_s, 1), "account": "connected by the AWS part"}
    assert api.repo is not None
    connect_account(stack, moto, api, api.repo)
    facts_s = wait_facts(stack.database_url)
    time.sleep(SETTLE)
    return {"wheelhouse_s": round(wheels_s, 1), "account": "connected", "facts_after_connect_s": round(facts_s, 1)}


def _wait_no_live_aws_rows(api: Api, timeout: float = ENDED_TIMEOUT) -> None:
    """Machines of an earlier part (terminated in moto) must have ended in
    Trainyard too, or the first attempt could be given one of them."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = api.get(f"/api/v1/workspaces/{api.workspace}/instances/", all=1)
        if not [i for i in rows if i["backend"] == "aws" and i["status"] not in ("terminated", "lost")]:
            return
        time.sleep(0.5)
    raise AwsBenchError(f"the AWS part's machines had not ended in Trainyard {timeout:.0f} s after it")


def _wait(what: str, check: Any, timeout: float, every: float = 0.1) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(every)
    raise AwsBenchError(f"{what}: not within {timeout:.0f} s")


def _ts(value: datetime | None) -> float | None:
    return value.timestamp() if value is not None else None


def _line_ts(database_url: str, job_id: str, text: str) -> float | None:
    import psycopg

    with psycopg.connect(database_url) as conn:
        return line_time(conn, job_id, text=text)


# ------------------------------------------------------------- spot notice


def _spot_rows(database_url: str, job_id: str) -> dict[str, Any]:
    """The job's attempts (with their instances) and checkpoint versions (epoch seconds)."""
    import psycopg

    with psycopg.connect(database_url) as conn:
        attempts = conn.execute(
            "SELECT a.number, a.started_at, a.finished_at, a.termination_reason, a.restored_checkpoint, a.first_seq,"
            " i.name, i.backend_id, i.zone, i.created_at, i.connected_at"
            " FROM runs_attempt a LEFT JOIN clouds_instance i ON i.id = a.instance_id"
            " WHERE a.job_id = %s ORDER BY a.number",
            (job_id,),
        ).fetchall()
        versions = conn.execute(
            "SELECT number, attempt, status, created_at, completed_at FROM artifacts_artifact"
            " WHERE job_id = %s AND kind = 'checkpoint' ORDER BY number",
            (job_id,),
        ).fetchall()
    return {
        "attempts": [
            {
                "number": n,
                "started_at": _ts(started),
                "finished_at": _ts(finished),
                "reason": reason,
                "restored_checkpoint": restored,
                "first_seq": first_seq,
                "instance": name,
                "instance_id": backend_id,
                "zone": zone,
                "instance_created": _ts(created),
                "connected_at": _ts(connected),
            }
            for n, started, finished, reason, restored, first_seq, name, backend_id, zone, created, connected in attempts
        ],
        "versions": [
            {"number": n, "attempt": a, "status": s, "created_at": _ts(c), "completed_at": _ts(d)}
            for n, a, s, c, d in versions
        ],
    }


def _rel(t: float | None, t0: float) -> float | None:
    return None if t is None else round(t - t0, 3)


def spot_sample(api: Api, stack: Stack, moto: MotoServer, boot: NoticeBoot, workflows: str) -> dict[str, Any]:
    db = stack.database_url
    run = api.submit("spot-resume", workflows_text=workflows)
    job_id = api.run(run["id"])["jobs"][0]["id"]
    _wait(
        f"run {run['name']}: attempt 1's first line",
        lambda: _line_ts(db, job_id, "attempt 1: commands running"),
        SPOT_TIMEOUT,
        every=0.2,
    )
    first = _spot_rows(db, job_id)["attempts"][0]
    first_id = first["instance_id"]
    if not first_id or first_id not in boot.booted:
        raise AwsBenchError(
            f"run {run['name']}: attempt 1 ran on {first['instance']} ({first_id}), not a booted EC2 machine"
        )
    time.sleep(random.uniform(*NOTICE_JITTER))
    before = len(moto.requests("RunInstances"))
    t0 = time.time()
    boot.notice(first_id, "terminate", t0 + NOTICE_AHEAD)
    second_line = _wait(
        f"run {run['name']}: attempt 2's first line",
        lambda: _line_ts(db, job_id, "attempt 2: commands running"),
        SPOT_TIMEOUT,
    )
    done = api.wait_finished(run["id"], timeout=120)
    rows = _spot_rows(db, job_id)
    if len(rows["attempts"]) < 2:
        raise AwsBenchError(f"run {run['name']}: attempt 2 printed but the job has {len(rows['attempts'])} attempt(s)")
    a1, a2 = rows["attempts"][0], rows["attempts"][1]
    second_id = a2["instance_id"]
    if not second_id or second_id == first_id or second_id not in boot.booted:
        raise AwsBenchError(f"run {run['name']}: attempt 2 ran on {a2['instance']} ({second_id}), not a second machine")
    install_start, runner_start = boot.user_data_started.get(second_id), boot.runner_started(second_id)
    if install_start is None or runner_start is None:
        raise AwsBenchError(f"{second_id}: no user data start or runner process seen by the boot helper")
    launches = [r for r in moto.requests("RunInstances")[before:] if not r["error"]]
    # The sync made at the notice: attempt 1's last version.
    wind_down = [v for v in rows["versions"] if v["attempt"] == 1 and v["status"] == "complete"]
    synced = wind_down[-1] if wind_down else None
    total = second_line - t0
    install = runner_start - install_start
    milestones = {
        "runner_read_notice": boot.notice_read.get(first_id),
        "attempt1_ended": a1["finished_at"],
        "instance2_row_created": a2["instance_created"],
        "run_instances_received": launches[0]["received"] if launches else None,
        "boot_saw_running": boot.seen_running.get(second_id),
        "user_data_started": install_start,
        **boot.install_steps(second_id),
        "runner_process_started": runner_start,
        "interruption_sync_complete": synced["completed_at"] if synced else None,
        "runner_hello": a2["connected_at"],
        "attempt2_started": a2["started_at"],
        "attempt2_first_line": second_line,
    }
    hello = a2["connected_at"]
    return {
        "run": run["name"],
        "status": done["status"],
        "attempts": [(a["number"], a["reason"], a["instance"], a["zone"]) for a in rows["attempts"]],
        "instances": [first_id, second_id],
        "restored_checkpoint": a2["restored_checkpoint"],
        "interruption_version": synced["number"] if synced else None,
        "notice_at": t0,
        "total_s": round(total, 3),
        "install_s": round(install, 3),
        "own_part_s": round(total - install, 3),
        # The install is on the critical path only if the hold for the last
        # sync ended before the new runner said hello (else total - install undercounts).
        "hold_ended_before_hello": bool(synced and hello and synced["completed_at"] <= hello),
        "run_instances_calls": len(launches),
        "milestones_s": {k: _rel(v, t0) for k, v in milestones.items()},
        "boot_log_tail": boot.log(second_id)[-1500:],
    }


def bench_spot_notice(api: Api, stack: Stack, moto: MotoServer, tmp: Path, samples: int) -> dict[str, Any]:
    workflows = api.workflows_text.rstrip("\n") + "\n" + SPOT_JOB
    _wait_no_live_aws_rows(api)
    boot = NoticeBoot(moto, tmp / "machines-spot").start()
    result: dict[str, Any] = {"samples": []}
    try:
        for i in range(samples):
            log(f"(5) spot sample {i + 1}/{samples}: notice (T = now + {NOTICE_AHEAD:.0f} s) → attempt 2's commands")
            sample = spot_sample(api, stack, moto, boot, workflows)
            result["samples"].append(sample)
            log(
                f"    {sample['total_s']:.2f} s total, install {sample['install_s']:.2f} s, Trainyard's part "
                f"{sample['own_part_s']:.2f} s ({' → '.join(sample['instances'])}, {sample['status']})"
            )
            for instance_id in sample["instances"]:
                _terminate_and_wait_ended(api, stack, moto, boot, instance_id)
    finally:
        result["cleanup"] = cleanup(moto, boot)
    s = result["samples"]
    result["total_median_s"] = round(statistics.median(x["total_s"] for x in s), 3)
    result["install_median_s"] = round(statistics.median(x["install_s"] for x in s), 3)
    result["own_part_median_s"] = round(statistics.median(x["own_part_s"] for x in s), 3)
    result["all_succeeded"] = all(x["status"] == "succeeded" for x in s)
    result["all_restored"] = all(
        x["restored_checkpoint"] is not None and x["restored_checkpoint"] == x["interruption_version"] for x in s
    )
    result["hold_never_critical"] = all(x["hold_ended_before_hello"] for x in s)
    keys = s[0]["milestones_s"].keys()
    result["milestones_median_s"] = {
        k: round(statistics.median(v), 3)
        for k in keys
        if (v := [x["milestones_s"][k] for x in s if x["milestones_s"][k] is not None])
    }
    return result


# ---------------------------------------------------------- checkpoint sync


def _make_files(root: Path) -> dict[str, Path]:
    """``big/``: one file of BIG_BYTES; ``small/``: SMALL_COUNT files of SMALL_BYTES (random bytes)."""
    big, small = root / "big", root / "small"
    big.mkdir(parents=True)
    small.mkdir()
    block = 1 << 24
    with open(big / "model.bin", "wb") as f:
        left = BIG_BYTES
        while left:
            f.write(os.urandom(min(block, left)))
            left -= min(block, left)
    for i in range(SMALL_COUNT):
        (small / f"shard-{i:04d}.bin").write_bytes(os.urandom(SMALL_BYTES))
    return {"big": big, "small": small}


def _s3(moto: MotoServer) -> Any:
    import boto3

    return boto3.client(
        "s3",
        region_name=REGION,
        endpoint_url=moto.url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def _boto3_upload(moto: MotoServer, folder: Path, prefix: str) -> float:
    """What a user writes: one client, ``upload_file`` per file in a plain
    loop, boto3's default TransferConfig. Seconds."""
    s3 = _s3(moto)
    files = sorted(p for p in folder.iterdir() if p.is_file())
    started = time.perf_counter()
    for path in files:
        s3.upload_file(str(path), BUCKET, f"{prefix}/{path.name}")
    seconds = time.perf_counter() - started
    keys = [f"{prefix}/{p.name}" for p in files]
    for i in range(0, len(keys), 1000):
        s3.delete_objects(Bucket=BUCKET, Delete={"Objects": [{"Key": k} for k in keys[i : i + 1000]]})
    return seconds


def _runner_log_seconds(data_dir: Path, job_id: str) -> float | None:
    """The runner's own "checkpoint N synced (...): k of n files uploaded in X.Xs" (begin → complete)."""
    pattern = re.compile(
        rf"job {re.escape(job_id)}: checkpoint \d+ synced \([^)]*\): \d+ of \d+ files uploaded in ([\d.]+)s"
    )
    for path in (data_dir / "local-runners").glob("*.log"):
        if found := pattern.search(path.read_text(errors="replace")):
            return float(found.group(1))
    return None


def _runner_sync(api: Api, stack: Stack, folder: Path, workflows: str) -> dict[str, Any]:
    """A real job on a local runner whose checkpoint folder holds ``folder``'s
    files; its sync when the commands end, timed from the database."""
    import psycopg

    run = api.submit("ckpt-sync", env={"SYNC_SOURCE": str(folder)}, workflows_text=workflows)
    done = api.wait_finished(run["id"], timeout=SYNC_TIMEOUT)
    job_id = done["jobs"][0]["id"]
    if done["status"] != "succeeded":
        raise AwsBenchError(f"sync run {run['name']} ended {done['status']}: {done.get('status_reason')}")
    commands_ended = _line_ts(stack.database_url, job_id, SYNC_LAST_LINE)
    with psycopg.connect(stack.database_url) as conn:
        row = conn.execute(
            "SELECT a.created_at, a.completed_at, a.storage_bucket, count(f.id), sum(f.size)"
            " FROM artifacts_artifact a JOIN artifacts_artifactfile f ON f.artifact_id = a.id"
            " WHERE a.job_id = %s AND a.kind = 'checkpoint' AND a.status = 'complete'"
            " GROUP BY a.id ORDER BY a.number LIMIT 1",
            (job_id,),
        ).fetchone()
    if row is None or commands_ended is None:
        raise AwsBenchError(f"sync run {run['name']}: no complete checkpoint version or no last line")
    begun, completed, bucket, files, size = _ts(row[0]), _ts(row[1]), row[2], int(row[3]), int(row[4])
    assert begun is not None and completed is not None
    return {
        "run": run["name"],
        "job": job_id,
        "bucket": bucket,
        "files": files,
        "bytes": size,
        "seconds": round(completed - commands_ended, 3),
        "staging_s": round(begun - commands_ended, 3),
        "upload_and_complete_s": round(completed - begun, 3),
        "runner_log_upload_s": _runner_log_seconds(stack.data_dir, job_id),
    }


def bench_sync(api: Api, stack: Stack, moto: MotoServer, tmp: Path) -> dict[str, Any]:
    free = shutil.disk_usage(tmp).free
    need = 6 * (BIG_BYTES + SMALL_COUNT * SMALL_BYTES)  # sources, staging, moto's copies of both uploads
    if free < need:
        raise AwsBenchError(f"{free / 1e9:.1f} GB free under {tmp}: the sync part needs about {need / 1e9:.1f} GB")
    workflows = api.workflows_text.rstrip("\n") + "\n" + SYNC_JOB
    root = tmp / "sync-files"
    log(
        f"(6) checkpoint sync: writing 1 × {BIG_BYTES / 1e6:.0f} MB and {SMALL_COUNT} × {SMALL_BYTES / 1e3:.0f} KB under {root}"
    )
    result: dict[str, Any] = {}
    try:
        folders = _make_files(root)
        for case, folder in folders.items():
            size = sum(p.stat().st_size for p in folder.iterdir())
            log(f"(6) {case}: plain boto3 upload_file, then a job's checkpoint sync")
            boto3_s = _boto3_upload(moto, folder, f"bench-baseline/{case}")
            sync = _runner_sync(api, stack, folder, workflows)
            if sync["bytes"] != size or sync["bucket"] != BUCKET:
                raise AwsBenchError(
                    f"sync of {case}: {sync['bytes']} bytes to {sync['bucket']!r}, not {size} to {BUCKET}"
                )
            sync_mb_s = size / 1e6 / sync["seconds"]
            boto3_mb_s = size / 1e6 / boto3_s
            result[case] = {
                "files": sync["files"],
                "bytes": size,
                "boto3_s": round(boto3_s, 3),
                "boto3_mb_s": round(boto3_mb_s, 1),
                "sync_mb_s": round(sync_mb_s, 1),
                "ratio": round(sync_mb_s / boto3_mb_s, 3),
                "sync": sync,
            }
            log(
                f"    boto3 {boto3_s:.2f} s ({boto3_mb_s:.0f} MB/s); sync {sync['seconds']:.2f} s ({sync_mb_s:.0f} MB/s: "
                f"staging {sync['staging_s']:.2f} s, upload + complete {sync['upload_and_complete_s']:.2f} s)"
            )
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return result


# --------------------------------------------------------------------- part


def bench_spot(api: Api, stack: Stack, moto: MotoServer, tmp: Path, *, samples: int) -> dict[str, Any]:
    log("(5) spot: the AWS account on moto and the runner's wheelhouse")
    result: dict[str, Any] = {"setup": ensure_account(api, stack, moto)}
    for key, measure in (
        ("notice", lambda: bench_spot_notice(api, stack, moto, tmp, samples)),
        ("sync", lambda: bench_sync(api, stack, moto, tmp)),
    ):
        try:
            result[key] = measure()
        except Exception as error:  # the other half still runs; the table says why
            message = str(error) if isinstance(error, AwsBenchError) else f"{type(error).__name__}: {error}"
            log(f"(5) spot {key}: {message}")
            result[key] = {"error": message}
    return result
