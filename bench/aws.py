"""The AWS part of the benchmark (bench/README.md): the milestones of a run on
a fresh EC2 instance and on a reused idle one, with moto's server playing
EC2 and S3 and tests/support/ec2boot.py playing each instance's boot (its
user data, unmodified, in a scratch folder).

Clocks: every timestamp is this machine's ``time.time()`` (moto, the boot
helper, the stack and the runner all run here), so milestones from
different processes can be subtracted.
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import psutil

from bench.lib import Api, frames, log, parse_iso
from tests.support.aws_account import prepare
from tests.support.ec2boot import Ec2Boot
from tests.support.frames import frame_span
from tests.support.logfill import line_time
from tests.support.moto import MotoServer
from tests.support.stack import Stack

BUCKET = "ty-bench-aws"
AMI = "ami-03cf127a"  # one of moto's built-in images (as tests/e2e/test_aws.py)
REGION = "us-east-1"
# Long enough for every reused-instance sample; the bench terminates the machine itself at the end.
IDLE_SECONDS = 600
PLACEMENT = f"    backends: [aws]\n    spot_policy: spot\n    idle_duration: {IDLE_SECONDS}s\n"
FRESH_TIMEOUT = 300.0  # submit → first line on a fresh instance (the install is most of it)
REUSE_TIMEOUT = 60.0
ENDED_TIMEOUT = 90.0  # Trainyard noticing a machine terminated behind its back (between fresh samples)
CLEANUP_TIMEOUT = 30.0
FACTS_TIMEOUT = 60.0
SETTLE = 2.0  # after the facts refresh: let the worker finish what the connect started
IDLE_PAUSE = 0.5

TARGET_OWN_PART_S = 2.0
TARGET_REUSE_RATIO = 2.0

TRAINYARD = Path(sys.executable).parent / "trainyard"


class AwsBenchError(RuntimeError):
    """The AWS part could not be measured (the message says why)."""


class TimedBoot(Ec2Boot):
    """``Ec2Boot`` that remembers, per instance, when its watcher saw it
    running and when the user data's ``sh`` process started."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.seen_running: dict[str, float] = {}
        self.user_data_started: dict[str, float] = {}

    def _boot(self, ec2: Any, instance: dict[str, Any]) -> None:
        instance_id = instance["InstanceId"]
        self.seen_running[instance_id] = time.time()
        super()._boot(ec2, instance)
        process = self.booted.get(instance_id)
        if process is not None:
            self.user_data_started[instance_id] = started_at(process.pid) or time.time()

    def runner_started(self, instance_id: str) -> float | None:
        """When the first ``trainyard-runner`` process of the instance's venv started."""
        runner = str(self.home(instance_id) / "venv" / "bin" / "trainyard-runner")
        started = [
            started_at(p.pid)
            for p in psutil.process_iter()
            if _safe(lambda p=p: any(runner == part for part in p.cmdline()))
        ]
        found = [t for t in started if t is not None]
        return min(found) if found else None

    def install_steps(self, instance_id: str) -> dict[str, float | None]:
        """When the user data's steps finished, from the files each one leaves (mtime)."""
        home = self.home(instance_id)
        pip = sorted((home / "wheels").glob("pip-*.whl"))

        def mtime(path: Path | None) -> float | None:
            return path.stat().st_mtime if path is not None and path.exists() else None

        return {
            "wheel_index_fetched": mtime(home / "wheels" / "index.html"),
            "pip_wheel_fetched": mtime(pip[0] if pip else None),
            "venv_made": mtime(home / "venv" / "pyvenv.cfg"),
            "runner_installed": mtime(home / "venv" / "bin" / "trainyard-runner"),
            "runner_env_written": mtime(home / "runner.env"),
        }

    def leftovers(self) -> list[str]:
        """Processes started from any instance's folder that still run."""
        root = str(self.root)
        found = []
        for p in psutil.process_iter():
            if _safe(lambda p=p: p.status() != psutil.STATUS_ZOMBIE and any(root in part for part in p.cmdline())):
                found.append(f"{p.pid} {' '.join(_safe_cmdline(p))}")
        return found


def started_at(pid: int) -> float | None:
    """When process ``pid`` started, as ``time.time()``, to 10 ms. Not psutil's
    ``create_time()``: it adds the boot time in whole seconds (``btime``), so
    it can be up to a second off this process's clock."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, IndexError, ValueError):
        return None
    ticks = os.sysconf("SC_CLK_TCK")
    return time.time() - uptime + int(fields[19]) / ticks  # field 22 (starttime); fields[0] is field 3


def _safe(check: Any) -> bool:
    try:
        return bool(check())
    except psutil.Error:
        return False


def _safe_cmdline(p: psutil.Process) -> list[str]:
    try:
        return p.cmdline()
    except psutil.Error:
        return []


def aws_workflows(text: str) -> str:
    """tiny-train's workflows with ``hello`` placed on AWS spot machines."""
    head = "  - name: hello\n    provider: bash\n"
    if head not in text:
        raise AwsBenchError("tiny-train's workflows.yaml has no `hello` job in the expected shape")
    return text.replace(head, head + PLACEMENT)


def connect_account(stack: Stack, moto: MotoServer, api: Api, cwd: Path) -> None:
    """The user's account as tests/e2e/test_aws.py has it, connected with the CLI."""
    prepare(moto, regions=[REGION], bucket=BUCKET)
    env = {**os.environ, "TRAINYARD_URL": stack.url, "TRAINYARD_TOKEN": api.token, "HOME": str(cwd.parent)}
    result = subprocess.run(
        [str(TRAINYARD), "backend", "add", "aws", "--access-key-id", "testing", "--secret-access-key", "testing",
         "--regions", REGION, "--bucket", BUCKET, "--ami", f"{REGION}={AMI}"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    if result.returncode != 0:
        raise AwsBenchError(f"`trainyard backend add aws` failed ({result.returncode}): {result.stderr}{result.stdout}")


def wait_facts(database_url: str, timeout: float = FACTS_TIMEOUT) -> float:
    """Connecting the account enqueues a refresh of its facts (instance
    types, spot prices: a few EC2 calls on a worker); wait for it, so the
    launch is measured on a connected account at rest, not against that."""
    import psycopg

    started = time.monotonic()
    with psycopg.connect(database_url, autocommit=True) as conn:
        while time.monotonic() - started < timeout:
            row = conn.execute(
                "SELECT config->'facts'->>'refreshed_at' FROM clouds_cloudaccount WHERE kind = 'aws'"
            ).fetchone()
            if row and row[0]:
                return time.monotonic() - started
            time.sleep(0.2)
    raise AwsBenchError(f"the aws account's facts were not refreshed within {timeout:.0f} s of connecting it")


def warm_wheels(stack: Stack) -> float:
    """The runner's wheelhouse is made once (not part of a boot); make it now."""
    started = time.monotonic()
    try:
        stack.manage("runner_wheels")
    except Exception as error:
        raise AwsBenchError(f"could not make the runner's wheelhouse (manage.py runner_wheels): {error}") from error
    return time.monotonic() - started


def _rows(database_url: str, job_id: str) -> dict[str, Any]:
    """What the database recorded for the job and its instance (epoch seconds)."""
    import psycopg

    with psycopg.connect(database_url) as conn:
        job = conn.execute(
            "SELECT j.started_at, j.instance_id, i.name, i.backend_id, i.created_at, i.launched_at, i.connected_at"
            " FROM runs_job j LEFT JOIN clouds_instance i ON i.id = j.instance_id WHERE j.id = %s",
            (job_id,),
        ).fetchone()
        first = line_time(conn, job_id)
        events = []
        if job and job[1]:
            events = conn.execute(
                "SELECT reason, to_status, created_at FROM clouds_instanceevent WHERE instance_id = %s"
                " ORDER BY created_at",
                (job[1],),
            ).fetchall()

    def ts(value: datetime | None) -> float | None:
        return value.timestamp() if value is not None else None

    if job is None:
        raise AwsBenchError(f"job {job_id} is not in the database")
    return {
        "job_started": ts(job[0]),
        "instance": job[2],
        "backend_id": job[3],
        "instance_created": ts(job[4]),
        "launched_at": ts(job[5]),
        "connected_at": ts(job[6]),
        "first_line_stored_ts": first,
        "events": [(reason, status, ts(at)) for reason, status, at in events],
    }


def _follow_first_line(api: Api, workflows: str, timeout: float) -> dict[str, Any]:
    """POST a hello run; the clock stops at the follower's first ``logs`` frame."""
    t0_wall = time.time()
    t0 = time.perf_counter()
    run = api.submit("hello", workflows_text=workflows)
    t_post = time.perf_counter()
    deadline = time.monotonic() + timeout
    first: dict[str, Any] | None = None
    try:
        with api.follow(run["id"]) as ws:
            for received, frame in frames(ws, timeout=max(deadline - time.monotonic(), 0.1)):
                if frame.get("type") == "logs":
                    first = {"received": received, "perf": time.perf_counter(), "line_ts": frame_span(frame)[2]}
                    break
                if time.monotonic() > deadline:
                    break
    except TimeoutError:
        pass
    if first is None:
        now = api.run(run["id"])
        jobs = [(j["name"], j["status"], j.get("instance"), j.get("status_reason", "")) for j in now["jobs"]]
        raise AwsBenchError(
            f"run {run['name']}: no log line within {timeout:.0f} s of the submit (run {now['status']}, jobs {jobs})"
        )
    done = api.wait_finished(run["id"], timeout=60)
    return {
        "run": run["name"],
        "status": done["status"],
        "job": done["jobs"][0]["id"],
        "t0": t0_wall,
        "latency_s": first["perf"] - t0,
        "post_returned": t0_wall + (t_post - t0),
        "run_created": parse_iso(done["created_at"]),
        "first_line_ts": first["line_ts"],
        "first_frame": first["received"],
    }


def _rel(t: float | None, t0: float) -> float | None:
    return None if t is None else round(t - t0, 3)


def fresh_sample(api: Api, stack: Stack, moto: MotoServer, boot: TimedBoot, workflows: str) -> dict[str, Any]:
    before = len(moto.requests("RunInstances"))
    sample = _follow_first_line(api, workflows, FRESH_TIMEOUT)
    rows = _rows(stack.database_url, sample["job"])
    instance_id = rows["backend_id"]
    if not instance_id or instance_id not in boot.booted:
        raise AwsBenchError(f"run {sample['run']} ran on {rows['instance']} ({instance_id}), not a booted EC2 machine")
    runs = [r for r in moto.requests("RunInstances")[before:] if not r["error"]]
    if not runs:
        raise AwsBenchError(f"run {sample['run']}: moto's request log has no RunInstances after the submit")
    launch_time = _moto_launch_time(moto, instance_id)
    t0 = sample["t0"]
    install_start, runner_start = boot.user_data_started.get(instance_id), boot.runner_started(instance_id)
    if install_start is None or runner_start is None:
        raise AwsBenchError(f"{instance_id}: no user data start or runner process seen by the boot helper")
    install = runner_start - install_start
    steps = boot.install_steps(instance_id)
    milestones = {
        "post_returned": sample["post_returned"],
        "run_created": sample["run_created"],
        "instance_row_created": rows["instance_created"],
        "run_instances_received": runs[0]["received"],  # moto got the call = it was sent (same machine)
        "run_instances_answered": runs[0]["answered"],
        "moto_launch_time": launch_time,  # whole seconds only: information, not a milestone
        "launched_recorded": rows["launched_at"],
        "boot_saw_running": boot.seen_running.get(instance_id),
        "user_data_started": install_start,
        **steps,
        "runner_process_started": runner_start,
        "runner_hello": rows["connected_at"],
        "job_started": rows["job_started"],
        "first_line_ts": sample["first_line_ts"],
        "first_line_stored_ts": rows["first_line_stored_ts"],
        "first_frame": sample["first_frame"],
    }
    total = sample["latency_s"]
    return {
        "run": sample["run"],
        "status": sample["status"],
        "instance": rows["instance"],
        "instance_id": instance_id,
        "total_s": round(total, 3),
        "install_s": round(install, 3),
        "own_part_s": round(total - install, 3),
        "run_instances_calls": len(runs),
        "milestones_s": {k: _rel(v, t0) for k, v in milestones.items()},
        "instance_events_s": [(reason, status, _rel(at, t0)) for reason, status, at in rows["events"]],
        "boot_log_tail": boot.log(instance_id)[-1500:],
    }


def reuse_sample(api: Api, stack: Stack, workflows: str, instance: str) -> dict[str, Any]:
    sample = _follow_first_line(api, workflows, REUSE_TIMEOUT)
    rows = _rows(stack.database_url, sample["job"])
    t0 = sample["t0"]
    return {
        "run": sample["run"],
        "status": sample["status"],
        "instance": rows["instance"],
        "reused": rows["instance"] == instance,
        "latency_ms": round(sample["latency_s"] * 1000, 1),
        "milestones_ms": {
            k: None if v is None else round((v - t0) * 1000, 1)
            for k, v in {
                "post_returned": sample["post_returned"],
                "run_created": sample["run_created"],
                "job_started": rows["job_started"],
                "first_line_ts": sample["first_line_ts"],
                "first_frame": sample["first_frame"],
            }.items()
        },
    }


def _moto_launch_time(moto: MotoServer, instance_id: str) -> float | None:
    found = _ec2(moto).describe_instances(InstanceIds=[instance_id])["Reservations"]
    instance = found[0]["Instances"][0] if found else {}
    launched = instance.get("LaunchTime")
    return launched.timestamp() if isinstance(launched, datetime) else None


def _ec2(moto: MotoServer) -> Any:
    import boto3

    return boto3.client(
        "ec2",
        region_name=REGION,
        endpoint_url=moto.url,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )


def _terminate_and_wait_ended(api: Api, stack: Stack, moto: MotoServer, boot: TimedBoot, instance_id: str) -> None:
    """Between fresh samples: end the machine in EC2 and wait until Trainyard's row has ended too."""
    _ec2(moto).terminate_instances(InstanceIds=[instance_id])
    deadline = time.monotonic() + ENDED_TIMEOUT
    while time.monotonic() < deadline:
        rows = api.get(f"/api/v1/workspaces/{api.workspace}/instances/", all=1)
        live = [i for i in rows if i["backend_id"] == instance_id and i["status"] not in ("terminated", "lost")]
        if not live and instance_id in boot.ended:
            return
        time.sleep(0.5)
    raise AwsBenchError(f"{instance_id} was terminated in moto but its row did not end within {ENDED_TIMEOUT:.0f} s")


def cleanup(moto: MotoServer, boot: TimedBoot) -> dict[str, Any]:
    """Terminate every instance of ours in moto, let the boot helper kill what
    each boot started, stop it; report what (if anything) is left."""
    live = [i["InstanceId"] for i in moto.our_instances()]
    if live:
        _ec2(moto).terminate_instances(InstanceIds=live)
    deadline = time.monotonic() + CLEANUP_TIMEOUT
    while time.monotonic() < deadline and not set(boot.booted) <= boot.ended:
        time.sleep(0.2)
    boot.stop()
    left_instances = [f"{i['InstanceId']} ({i['State']['Name']})" for i in moto.our_instances()]
    left_processes = boot.leftovers()
    return {"terminated": live, "left_instances": left_instances, "left_processes": left_processes}


def bench_aws(
    api: Api, stack: Stack, moto: MotoServer, tmp: Path, *, fresh: int, reuse: int, local_median_ms: float | None
) -> dict[str, Any]:
    workflows = aws_workflows(api.workflows_text)
    log("(4) AWS on moto: connecting the account, making the runner's wheelhouse")
    wheels_s = warm_wheels(stack)
    assert api.repo is not None
    connect_account(stack, moto, api, api.repo)
    facts_s = wait_facts(stack.database_url)
    time.sleep(SETTLE)
    boot = TimedBoot(moto, tmp / "machines").start()
    result: dict[str, Any] = {
        "wheelhouse_s": round(wheels_s, 1),
        "facts_after_connect_s": round(facts_s, 1),
        "fresh": [],
        "reuse": [],
    }
    try:
        for i in range(fresh):
            if i:
                _terminate_and_wait_ended(api, stack, moto, boot, result["fresh"][-1]["instance_id"])
                time.sleep(IDLE_PAUSE)
            log(f"(4) fresh instance {i + 1}/{fresh}: submit → first log line (timeout {FRESH_TIMEOUT:.0f} s)")
            sample = fresh_sample(api, stack, moto, boot, workflows)
            result["fresh"].append(sample)
            log(
                f"    {sample['total_s']:.2f} s total, install {sample['install_s']:.2f} s, "
                f"Trainyard's part {sample['own_part_s']:.2f} s ({sample['instance_id']}, {sample['status']})"
            )
            time.sleep(IDLE_PAUSE)
        instance = result["fresh"][-1]["instance"]
        log(f"(4) {reuse} runs on the idle instance {instance}: submit → first log line")
        for i in range(reuse):
            sample = reuse_sample(api, stack, workflows, instance)
            result["reuse"].append(sample)
            log(f"    sample {i + 1}: {sample['latency_ms']:7.1f} ms  ({sample['run']}, on {sample['instance']})")
            time.sleep(IDLE_PAUSE)
    finally:
        result["cleanup"] = cleanup(moto, boot)
    fresh_own = [s["own_part_s"] for s in result["fresh"]]
    reuse_ms = [s["latency_ms"] for s in result["reuse"]]
    result["fresh_total_median_s"] = round(statistics.median(s["total_s"] for s in result["fresh"]), 3)
    result["fresh_install_median_s"] = round(statistics.median(s["install_s"] for s in result["fresh"]), 3)
    result["fresh_own_part_median_s"] = round(statistics.median(fresh_own), 3)
    result["reuse_median_ms"] = round(statistics.median(reuse_ms), 1)
    result["all_reused"] = all(s["reused"] for s in result["reuse"])
    result["all_succeeded"] = all(s["status"] == "succeeded" for s in result["fresh"] + result["reuse"])
    result["local_median_ms"] = local_median_ms
    result["reuse_ratio"] = round(result["reuse_median_ms"] / local_median_ms, 2) if local_median_ms else None
    keys = result["fresh"][0]["milestones_s"].keys()
    result["fresh_milestones_median_s"] = {
        k: round(statistics.median(v), 3)
        for k in keys
        if (v := [s["milestones_s"][k] for s in result["fresh"] if s["milestones_s"][k] is not None])
    }
    return result
