"""Where does the time of the durable-log path go? A diagnostic, not part of
``make bench``.

    .venv/bin/python bench/profile_logs.py [--lines 200000] [--pyspy /tmp/venv-tools/bin/py-spy]

Starts the same environment as bench/run.py, warms a runner with one
``hello`` run, then runs ``noisy`` while measuring:

- CPU seconds used by each component (web, runner + its job, worker,
  Postgres, Valkey, this follower) between the submit and the moment the
  follower has the last line, against the wall time × cores available;
- with ``--pyspy``: a py-spy profile (non-blocking sampling) of the web and
  runner processes, summarised as the functions with the most samples
  (inclusive), so the cost of each step of the pipeline is visible.
"""

from __future__ import annotations

import argparse
import collections
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil

from bench.lib import Api, bench_environment, frames, log, make_repo, sigterm_as_interrupt
from tests.support.frames import frame_span

IDLE_SECONDS = 4.0


def tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def pg_stats(database_url: str) -> dict[str, int]:
    """Sessions opened, transactions committed, WAL written (PG ≥ 14)."""
    import psycopg

    with psycopg.connect(database_url, autocommit=True) as conn:
        sessions, commits = conn.execute(
            "SELECT sessions, xact_commit FROM pg_stat_database WHERE datname = current_database()"
        ).fetchone()
        wal = conn.execute("SELECT pg_current_wal_lsn() - '0/0'::pg_lsn").fetchone()[0]
    return {"sessions": int(sessions), "commits": int(commits), "wal_bytes": int(wal)}


def cpu_seconds(processes: list[psutil.Process]) -> float:
    total = 0.0
    for p in processes:
        try:
            t = p.cpu_times()
            total += t.user + t.system + t.children_user + t.children_system
        except psutil.Error:
            pass
    return total


def components(stack: Any, tmp: Path) -> dict[str, list[psutil.Process]]:
    from backend.embedded.runners import _read_pid

    found: dict[str, list[psutil.Process]] = {}
    for name in ("web", "worker", "beat"):
        found[name] = tree(stack._processes[name].pid)
    runners = [pid for f in (stack.data_dir / "local-runners").glob("*.pid") if (pid := _read_pid(f))]
    found["runner (+ job)"] = [p for pid in runners for p in tree(pid)]
    pg_pid = tmp / "services" / "pg" / "postmaster.pid"
    if pg_pid.exists():
        found["postgres"] = tree(int(pg_pid.read_text().split()[0]))
    vk_pid = tmp / "services" / "valkey" / "valkey-server.pid"
    if vk_pid.exists():
        found["valkey"] = tree(int(vk_pid.read_text().split()[0]))
    found["follower (this script)"] = [psutil.Process(os.getpid())]
    return found


def pyspy_start(pyspy: str, pid: int, out: Path, subprocesses: bool) -> subprocess.Popen[bytes]:
    cmd = [pyspy, "record", "--nonblocking", "-r", "200", "-f", "raw", "-o", str(out), "-p", str(pid)]
    if subprocesses:
        cmd.append("-s")
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def pyspy_summary(path: Path, top: int = 30) -> str:
    """Inclusive sample counts per function from py-spy's raw (collapsed) output."""
    inclusive: collections.Counter[str] = collections.Counter()
    leaf: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        names = [_short(f) for f in stack.split(";")]
        for name in set(names):
            inclusive[name] += n
        leaf[names[-1]] += n
    lines = [f"{path.name}: {total} samples (non-idle)", "  inclusive:"]
    for name, n in inclusive.most_common(top):
        lines.append(f"    {100 * n / max(total, 1):5.1f}%  {name}")
    lines.append("  self (leaf):")
    for name, n in leaf.most_common(12):
        lines.append(f"    {100 * n / max(total, 1):5.1f}%  {name}")
    return "\n".join(lines)


FOCUS = (
    "RunnerConsumer.receive ",
    "TypeAdapter.validate_json",
    "RunnerConsumer.on_logs ",
    "logs_store",
    "_copy (",
    "TextFormatter.write_row",
    "fromtimestamp",
    "Connection.wait",
    "BaseDatabaseWrapper.connect",
    "close_old_connections",
    "on_logs.<locals>.<listcomp>",
    "RedisChannelLayer.group_send",
    "BaseMessageSerializer.serialize",
    "BaseMessageSerializer.deserialize",
    "RunFollowConsumer.run_logs",
    "send_json",
    "JSONEncoder.iterencode",
    "PerMessageDeflate.encode",
    "PerMessageDeflate.decode",
    "LogAck",
)


def focus_summary(path: Path) -> str:
    inclusive: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        total += int(count)
        for key in FOCUS:
            if key in stack:
                inclusive[key] += int(count)
    rows = [f"  pipeline steps (inclusive % of {total} non-idle samples):"]
    rows += [f"    {100 * inclusive[k] / max(total, 1):5.1f}%  {k.strip()}" for k in FOCUS if inclusive[k]]
    return "\n".join(rows)


def _short(frame: str) -> str:
    # "func (path/to/file.py:123)" -> "func (file.py)"
    name, _, rest = frame.partition(" (")
    file = rest.split(":")[0].rstrip(")")
    parts = Path(file).parts
    return f"{name} ({'/'.join(parts[-2:])})" if file else name


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lines", type=int, default=200_000)
    parser.add_argument("--pyspy", help="path of a py-spy binary (install it outside the project venv)")
    parser.add_argument("--out", type=Path, default=Path("/tmp/trainyard-bench-profile"))
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    try:
        with sigterm_as_interrupt(), bench_environment() as (stack, tmp, _):
            token = stack.issue_token("bench").strip().splitlines()[-1]
            repo, origin = make_repo(tmp / "repo" / "tiny-train")
            api = Api(url=stack.url, ws_url=stack.ws_url, token=token)
            api.use_repo(repo, origin)
            for _ in range(2):
                api.wait_finished(api.submit("hello")["id"])
            time.sleep(0.5)
            parts = components(stack, tmp)
            spies: list[subprocess.Popen[bytes]] = []
            if args.pyspy:
                spies.append(pyspy_start(args.pyspy, stack._processes["web"].pid, args.out / "web.txt", False))
                for p in parts["runner (+ job)"]:
                    spies.append(pyspy_start(args.pyspy, p.pid, args.out / f"runner-{p.pid}.txt", False))
                time.sleep(1.5)  # py-spy attaches
            idle_before = {name: cpu_seconds(ps) for name, ps in parts.items()}
            time.sleep(IDLE_SECONDS)
            before = {name: cpu_seconds(ps) for name, ps in parts.items()}
            idle = {name: (before[name] - idle_before[name]) / IDLE_SECONDS for name in parts}
            pg_before = pg_stats(stack.database_url)
            t0 = time.time()
            run = api.submit("noisy", {"LINES": str(args.lines)})
            first_ts = None
            per_frame: list[tuple[float, float, int]] = []  # (received, ts of last line, n)
            with api.follow(run["id"]) as ws:
                for received, frame in frames(ws, timeout=300):
                    if frame.get("type") != "logs":
                        continue
                    first_seq, last_seq, ts, last_ts = frame_span(frame)
                    if first_seq == 1:
                        first_ts = ts
                    per_frame.append((received, last_ts, last_seq - first_seq + 1))
                    if last_seq >= args.lines:
                        break
            t1 = time.time()
            pg_after = pg_stats(stack.database_url)
            # live processes now (the job's own process may have exited: its CPU is in the runner's children times)
            after = {name: cpu_seconds(ps) for name, ps in parts.items()}
            for spy in spies:
                spy.send_signal(signal.SIGINT)
            for spy in spies:
                try:
                    spy.wait(20)
                except subprocess.TimeoutExpired:
                    spy.kill()
                    spy.wait()
            api.wait_finished(run["id"])
            api.close()
    except KeyboardInterrupt:
        log("interrupted: everything was stopped and removed")
        return 130

    wall = t1 - t0
    assert first_ts is not None
    print(
        f"noisy LINES={args.lines}: submit→last line at follower {wall:.2f} s; first line ts→last received {t1 - first_ts:.2f} s "
        f"= {args.lines / (per_frame[-1][0] - first_ts):,.0f} lines/s; runner read all lines by +{per_frame[-1][1] - first_ts:.2f} s"
    )
    print(
        f"CPU seconds per component over those {wall:.2f} s (machine capacity {os.cpu_count()} × {wall:.2f} = {os.cpu_count() * wall:.2f} CPU-s):"
    )
    for name in before:
        used = after[name] - before[name]
        print(
            f"  {name:24s} {used:6.2f} CPU-s  ({100 * used / wall:5.1f}% of one core; idle before: {100 * idle[name]:4.1f}%)"
        )
    print(
        "postgres activity on the stack's database over that window: "
        + ", ".join(f"{k} +{pg_after[k] - pg_before[k]}" for k in pg_before)
    )
    lags = [received - ts for received, ts, _ in per_frame]
    sizes = [n for _, _, n in per_frame]
    print(
        f"follower frames: {len(per_frame)}, lines/frame median {sorted(sizes)[len(sizes) // 2]}, "
        f"lag (receipt - runner ts of the frame's last line) first {lags[0]:.3f} s, median {sorted(lags)[len(lags) // 2]:.3f} s, last {lags[-1]:.3f} s"
    )
    if args.pyspy:
        for path in sorted(args.out.glob("*.txt")):
            if path.stat().st_size:
                print()
                print(pyspy_summary(path))
                print(focus_summary(path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
