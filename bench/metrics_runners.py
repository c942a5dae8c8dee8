"""Part ``metrics`` of ``make bench`` (bench/README.md), its rows that use
the stack's processes: what a job's sampling costs the job, and what many
runners' metrics and logs cost one web process.

- **the sampler's cost**: a CPU-bound job on every core, through the
  stack's local runners, sampled every 5 s (``metrics: {interval: 5s}``)
  and once an hour (in effect: not), alternately (ABBA); each job times
  its own work. Slowdown = median sampled / median unsampled − 1, shown
  only when the unsampled jobs' own times agree within
  SAMPLER_NOISE_LIMIT. Target (issue 35): ≤ 1 %.
- **runner load**: ``--metrics-runners`` simulated runners
  (bench/metrics_load.py: the real protocol over real websockets, no job
  process), each with one job of the bench's ``bench-metrics`` workflow,
  sending LINES_PER_S log lines a second and a ``Metrics`` frame every 5 s
  (one sample of 8 GPUs and its loss values), against the stack's one web
  process. Once every runner's job runs, all start printing together,
  and SETTLE seconds later the web
  process's CPU (utime + stime from ``/proc/<pid>/stat``, % of one core)
  is taken over ``--metrics-seconds``, while a follower of one of the jobs
  (the run's websocket, as the dashboard opens it) records, for every
  ``logs`` frame, its arrival minus its last line's time (the simulated
  runner's clock is this machine's). Targets (issue 35): ≤ 50 % of one
  core, p99 ≤ 250 ms.
"""

from __future__ import annotations

import contextlib
import importlib.util
import multiprocessing
import os
import queue
import statistics
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil

from bench.lib import FINISHED, Api, frames, log, percentile
from bench.metrics_load import ACK_TIMEOUT, COUNTED, GPUS, LINES_PER_S, METRICS_EVERY, client_process, pooled_ack_ms
from tests.support.frames import frame_span
from tests.support.stack import Stack

TARGET_WEB_CPU_PERCENT = 50.0
TARGET_FOLLOWER_P99_MS = 250.0
TARGET_SLOWDOWN = 0.01
SAMPLER_PAIRS = 4  # jobs with and without sampling, in ABBA order
SAMPLER_WORK = 300_000_000  # loop iterations per worker: about 20 s on a quiet 2-core machine (4 samples at 5 s)
SAMPLER_TIMEOUT = 300.0
# The unsampled jobs' spread ((max - min) / median) above which one run cannot tell 1 %.
SAMPLER_NOISE_LIMIT = 0.05

CLIENT_PROCESSES = 4
SETTLE = 10.0  # seconds after the jobs started printing, before the window
IDLE_SECONDS = 5.0  # the web process alone, before the runners connect
CONNECT_TIMEOUT = 300.0
START_TIMEOUT = 600.0
FINISH_TIMEOUT = 120.0

# Nothing runs: the simulated runners play the job. Self-hosted only, so no
# local runner is started for these runs and no simulated runner gets another part's.
WORKFLOW = """
workflows:
  - name: bench-metrics
    provider: bash
    backends: [self-hosted]
    commands:
      - python train.py
"""

# 500 submissions and registrations from one user and address stand for
# many people's: the per-user and per-address limits are off for the part.
UNLIMITED = {"TRAINYARD_RATE_RUN_USER": "off", "TRAINYARD_RATE_RUN_IP": "off"}


def bench_metrics_runners(
    api: Api, stack: Stack, tmp: Path, *, runners: int, seconds: float, pyspy: str | None = None
) -> dict[str, Any]:
    """The sampler's cost, then the runner load; one that could not be
    measured says why (``error``) and the other still runs."""
    results: dict[str, Any] = {}
    try:
        results["sampler"] = bench_sampler_cost(api)
    except Exception as error:
        log(f"(metrics) sampler cost: {type(error).__name__}: {error}")
        results["sampler"] = {"error": f"{type(error).__name__}: {error}"}
    try:
        results["load"] = bench_runner_load(api, stack, tmp, runners=runners, seconds=seconds, pyspy=pyspy)
    except Exception as error:
        log(f"(metrics) runner load: {type(error).__name__}: {error}")
        results["load"] = {"runners": runners, "error": f"{type(error).__name__}: {error}"}
    return results


# ------------------------------------------------------------ the sampler's cost

# A CPU-bound job on every core: one worker a core, each SAMPLER_WORK loop
# iterations; it prints the wall time of the work alone (not its start-up).
# ``metrics.interval`` is the runner's sampling: 5 s (the default), or once
# an hour, which for a job of seconds is its first sample and its last only.
_CPU_JOB = """
  - name: bench-cpu-{name}
    provider: bash
    metrics: {{interval: {interval}}}
    commands:
      - |
        python3 -c '
        import multiprocessing, os, time
        def work(n):
            x = 0
            for i in range(n):
                x += i * i
            return x
        if __name__ == "__main__":
            cores = os.cpu_count()
            started = time.perf_counter()
            with multiprocessing.Pool(cores) as pool:
                pool.map(work, [int(os.environ["WORK"])] * cores)
            print(f"elapsed {{time.perf_counter() - started:.4f}}")
        '
"""


def bench_sampler_cost(api: Api) -> dict[str, Any]:
    """SAMPLER_PAIRS jobs sampled every 5 s and as many sampled once an
    hour (in effect: not), alternately (ABBA) on the stack's local runners;
    each times its own work. Slowdown = median sampled / median unsampled − 1."""
    text = api.workflows_text + _CPU_JOB.format(name="sampled", interval="5s")
    text += _CPU_JOB.format(name="unsampled", interval="1h")
    log(f"(metrics) sampler cost: {2 * SAMPLER_PAIRS} CPU-bound jobs on every core, sampled every 5 s or not")
    order = [w for i in range(SAMPLER_PAIRS) for w in (("sampled", "unsampled"), ("unsampled", "sampled"))[i % 2]]
    times: dict[str, list[float]] = {"sampled": [], "unsampled": []}
    samples: dict[str, list[int]] = {"sampled": [], "unsampled": []}
    warm_up = api.submit("bench-cpu-unsampled", {"WORK": str(SAMPLER_WORK // 10)}, workflows_text=text)
    api.wait_finished(warm_up["id"], timeout=SAMPLER_TIMEOUT)  # a runner started, its caches warm
    for which in order:
        run = api.submit(f"bench-cpu-{which}", {"WORK": str(SAMPLER_WORK)}, workflows_text=text)
        done = api.wait_finished(run["id"], timeout=SAMPLER_TIMEOUT)
        if done["status"] != "succeeded":
            raise RuntimeError(f"run {done['name']} ({which}) ended {done['status']}: {done.get('status_reason')}")
        elapsed = _elapsed(api, done["jobs"][0]["id"])
        times[which].append(elapsed)
        samples[which].append(_cpu_samples(api, done["name"], done["jobs"][0]["name"]))
        log(f"    {which:9s} {elapsed:.3f} s, {samples[which][-1]} samples ({done['name']})")
    sampled, unsampled = statistics.median(times["sampled"]), statistics.median(times["unsampled"])
    return {
        "pairs": SAMPLER_PAIRS,
        "work": SAMPLER_WORK,
        "seconds": times,
        "sampled_median_s": round(sampled, 3),
        "unsampled_median_s": round(unsampled, 3),
        "slowdown": round(sampled / unsampled - 1, 4),
        # The job's CPU samples the server stored: the switch did what it says.
        "samples": samples,
        # How far apart the unsampled jobs' own times were: what one run can tell.
        "spread": round((max(times["unsampled"]) - min(times["unsampled"])) / unsampled, 4),
    }


def _cpu_samples(api: Api, run: str, job: str) -> int:
    """How many CPU samples the server holds of the run's job (its series API)."""
    body = api.get(f"/api/v1/workspaces/{api.workspace}/runs/{run}/metrics/series/", job=job, names="cpu")
    return sum(len(s["points"]["x"]) for s in body["series"])


def _elapsed(api: Api, job: str) -> float:
    with api.new_client() as client:
        response = client.get(f"/api/v1/workspaces/{api.workspace}/jobs/{job}/logs/raw")
        response.raise_for_status()
    for line in response.text.splitlines():
        if line.startswith("elapsed "):
            return float(line.split()[1])
    raise RuntimeError(f"job {job} printed no elapsed time: {response.text[-300:]!r}")


# ------------------------------------------------------------ runner load


def server_takes_metrics() -> bool:
    """This checkout's server stores ``Metrics`` frames (its metrics app is there)."""
    return importlib.util.find_spec("backend.metrics") is not None


def bench_runner_load(
    api: Api, stack: Stack, tmp: Path, *, runners: int, seconds: float, pyspy: str | None = None
) -> dict[str, Any]:
    with_metrics = server_takes_metrics()
    log(
        f"(metrics) {runners} simulated runners, one job each ({LINES_PER_S} lines/s"
        + (f", a Metrics frame of {GPUS} GPUs every {METRICS_EVERY:.0f} s" if with_metrics else ", no Metrics frames")
        + f"), against one web process; window {seconds:.0f} s"
    )
    with stack.env_changed(UNLIMITED, restart=["web"]):
        idle = _Cpu([stack.pid("web")])
        time.sleep(IDLE_SECONDS)
        idle_percent = idle.percent()
        with (
            _Fleet(api, stack, runners, metrics=with_metrics) as fleet,
            _follower(api, fleet.runs[0]["id"]) as seen,
        ):
            fleet.state.pump(SETTLE)
            profile = _profile(stack.pid("web"), seconds, pyspy) if pyspy else None
            meters = {
                "web": _Cpu([stack.pid("web")]),
                "worker": _Cpu([stack.pid("worker")]),
                "postgres": _Cpu(_postgres_pids(tmp)),
                "simulated runners": _Cpu([p.pid for p in fleet.processes if p.pid]),
            }
            t0, before = time.time(), fleet.state.total()
            fleet.state.pump(seconds)
            t1, after = time.time(), fleet.state.total()
            cpu = {name: meter.percent() for name, meter in meters.items()}
    summaries = fleet.summaries
    latencies = [ms for ms, t in seen["frames"] if t0 <= t <= t1]
    totals = {k: sum(s[k] for s in summaries) for k in ("connected", "assigned", "running", "finished")}
    totals.update({k: sum(s[k] for s in summaries) for k in ("log_frames", "lines", "metrics_frames", "heartbeats")})
    closes = [c for s in summaries for c in s["closes"]]
    errors = [e for s in summaries for e in s["errors"]]
    return {
        "runners": runners,
        "metrics_frames_sent": with_metrics,
        "seconds": round(t1 - t0, 1),
        "cpu_percent": cpu,
        "web_idle_percent": idle_percent,
        "web_profile": profile.result() if profile else None,
        "follower_frames": len(latencies),
        "follower_lines": seen["lines"],
        "follower_gaps": seen["gaps"],
        "p50_ms": round(statistics.median(latencies), 1) if latencies else None,
        "p99_ms": round(percentile(latencies, 99), 1) if latencies else None,
        "max_ms": round(max(latencies), 1) if latencies else None,
        "ack_ms": pooled_ack_ms(summaries),
        # Sent by the simulated runners in the window, per second.
        "rates": {k: round((after[k] - before[k]) / (t1 - t0), 1) for k in COUNTED if k != "running"},
        **totals,
        "ack_timeouts": sum(s["ack_timeouts"] for s in summaries),
        "closed_by_server": len(closes),
        "closes": sorted(set(closes))[:5],
        "errors": errors[:5],
        "error_count": len(errors),
        "runs_finished": fleet.finished,
        "metrics_stored": _metrics_stored(api, fleet.runs[0]["name"]) if with_metrics else None,
    }


def _profile(pid: int, seconds: float, pyspy: str) -> Any:
    """py-spy's sampled profile of ``pid`` over ``seconds`` (collapsed
    stacks of the thread holding the GIL: where its Python CPU goes), in
    the background; its ``result()`` is the file's path."""
    out = Path(tempfile.gettempdir()) / f"trainyard-bench-metrics-web-{pid}.txt"
    args = [
        pyspy,
        "record",
        "-p",
        str(pid),
        "-d",
        str(int(seconds)),
        "-r",
        "50",
        "--nonblocking",
        "--gil",
        "-f",
        "raw",
        "-o",
        str(out),
    ]
    process = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    class Done:
        def result(self) -> str:
            process.wait(timeout=seconds + 60)
            return str(out) if out.exists() else f"py-spy failed (exit {process.returncode})"

    return Done()


class _Fleet:
    """``count`` simulated runners, registered, connected from
    CLIENT_PROCESSES processes, each running one job of a ``bench-metrics``
    run submitted for it, while the block runs. On the way out they finish
    their jobs (``summaries``: what each process counted), the runs' end
    statuses are taken (``finished``) and the runners are revoked."""

    def __init__(self, api: Api, stack: Stack, count: int, *, metrics: bool) -> None:
        self.api, self.stack, self.count, self.metrics = api, stack, count, metrics
        self.runs: list[dict[str, Any]] = []
        self.summaries: list[dict[str, Any]] = []
        self.finished: dict[str, int] = {}
        self.processes: list[Any] = []

    def __enter__(self) -> _Fleet:
        self.registered = _register(self.api, self.count)
        try:
            self._start()
        except BaseException:
            self._end()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self._end()

    def _start(self) -> None:
        context = multiprocessing.get_context("spawn")
        events, self.go, self.stop = context.Queue(), context.Event(), context.Event()
        shares = [self.registered[i::CLIENT_PROCESSES] for i in range(CLIENT_PROCESSES)]
        url = f"{self.stack.ws_url}/ws/runner/"
        self.processes = [
            context.Process(
                target=client_process,
                args=(url, [(r["runner_token"], r["name"]) for r in share], events, self.go, self.stop, self.metrics),
                daemon=True,
            )
            for share in shares
            if share
        ]
        for p in self.processes:
            p.start()
        self.state = state = _Progress(events, len(self.processes))
        state.wait(lambda: len(state.connected) == len(self.processes), CONNECT_TIMEOUT, "the runners' hellos")
        log(f"    {sum(state.connected.values())} of {self.count} runners connected; submitting {self.count} runs")
        started = time.monotonic()
        self.runs = _submit(self.api, self.count)
        log(f"    {len(self.runs)} runs submitted in {time.monotonic() - started:.1f} s")
        state.wait(lambda: state.running() >= len(self.runs), START_TIMEOUT, "every job running")
        log(f"    {state.running()} jobs running {time.monotonic() - started:.1f} s after the first submission")
        self.go.set()

    def _end(self) -> None:
        try:
            if self.processes:
                self.stop.set()
                with contextlib.suppress(RuntimeError):
                    self.summaries = self.state.results(timeout=60)
                for p in self.processes:
                    p.join(timeout=10)
                    if p.is_alive():
                        p.kill()
            if self.runs:
                self.finished = _wait_finished(self.api, self.runs)
        finally:
            _revoke(self.api, [r["runner"] for r in self.registered])


def _register(api: Api, count: int) -> list[dict[str, Any]]:
    """``count`` self-hosted runners of the bench's workspace, registered as
    ``trainyard-runner register`` does: a registration token each, spent."""
    started = time.monotonic()
    base = f"/api/v1/workspaces/{api.workspace}/runners"

    def one(i: int) -> dict[str, Any]:
        with api.new_client() as client:
            made = client.post(f"{base}/registration-tokens/", json={"note": "bench metrics"})
            made.raise_for_status()
            answer = client.post(
                "/api/v1/runner/register/",
                json={"token": made.json()["token"], "name": f"bench-metrics-{i}", "hostname": f"bench-{i}"},
            )
            answer.raise_for_status()
            return answer.json()

    with ThreadPoolExecutor(8) as pool:
        registered = list(pool.map(one, range(count)))
    log(f"    {count} runners registered in {time.monotonic() - started:.1f} s")
    return registered


def _revoke(api: Api, runner_ids: list[str]) -> None:
    """Revoked, so no later part's job is given to a runner that is gone."""
    base = f"/api/v1/workspaces/{api.workspace}/runners"

    def one(runner_id: str) -> None:
        with api.new_client() as client:
            client.post(f"{base}/{runner_id}/revoke/")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, runner_ids))


class _Progress:
    """The client processes' reports: connected runners, running jobs, summaries."""

    def __init__(self, events: Any, processes: int) -> None:
        self.events, self.processes = events, processes
        self.connected: dict[int, int] = {}
        self.counts: dict[int, dict[str, int]] = {}
        self.done: list[dict[str, Any]] = []
        self._order: dict[int, int] = {}

    def running(self) -> int:
        return self.total()["running"]

    def total(self) -> dict[str, int]:
        """The latest counts of every client process, added up."""
        return {k: sum(c[k] for c in self.counts.values()) for k in COUNTED}

    def pump(self, seconds: float) -> None:
        """Take reports for ``seconds``."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self._take(min(left, 0.5))

    def _take(self, timeout: float) -> None:
        try:
            pid, kind, value = self.events.get(timeout=timeout)
        except queue.Empty:
            return
        if kind == "connected":
            self.connected[pid] = value
        elif kind == "counts":
            self.counts[pid] = value
        elif kind == "done":
            self.done.append(value)

    def wait(self, condition: Any, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not condition():
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"timed out after {timeout:.0f} s waiting for {what} "
                    f"(connected {sum(self.connected.values())}, running {self.running()})"
                )
            self._take(0.5)

    def results(self, timeout: float) -> list[dict[str, Any]]:
        self.wait(lambda: len(self.done) == self.processes, timeout, "the simulated runners to finish")
        return self.done


def _submit(api: Api, count: int) -> list[dict[str, Any]]:
    with api.new_client() as client, ThreadPoolExecutor(8) as pool:
        return list(
            pool.map(lambda _: api.submit("bench-metrics", client=client, workflows_text=WORKFLOW), range(count))
        )


def _wait_finished(api: Api, runs: list[dict[str, Any]]) -> dict[str, int]:
    """The runs' statuses once all finished (or FINISH_TIMEOUT passed)."""
    ids = {r["id"] for r in runs}
    deadline = time.monotonic() + FINISH_TIMEOUT
    statuses: dict[str, str] = {}
    while time.monotonic() < deadline:
        statuses = _statuses(api, ids)
        if len(statuses) == len(ids) and all(s in FINISHED for s in statuses.values()):
            break
        time.sleep(1)
    counted: dict[str, int] = {}
    for status in statuses.values():
        counted[status] = counted.get(status, 0) + 1
    return counted


def _statuses(api: Api, ids: set[str]) -> dict[str, str]:
    """The status of each of the runs ``ids``, newest pages of the runs list first."""
    found: dict[str, str] = {}
    url: str | None = f"/api/v1/workspaces/{api.workspace}/runs/?page_size=500"
    with api.new_client() as client:
        while url and len(found) < len(ids):
            response = client.get(url)
            response.raise_for_status()
            page = response.json()
            found.update({r["id"]: r["status"] for r in page["results"] if r["id"] in ids})
            url = page.get("next")
    return found


def _metrics_stored(api: Api, run: str) -> dict[str, Any]:
    """What the server kept of one run's metrics (its metrics API)."""
    try:
        body = api.get(f"/api/v1/workspaces/{api.workspace}/runs/{run}/metrics/")
    except Exception as error:
        return {"error": f"{type(error).__name__}: {error}"[:200]}
    jobs = body.get("jobs") or [{}]
    return {"system": len(jobs[0].get("system") or []), "training": jobs[0].get("training") or []}


@contextlib.contextmanager
def _follower(api: Api, run_id: str) -> Iterator[dict[str, Any]]:
    """A follower of ``run_id`` in a thread: (latency ms, arrival) of every
    ``logs`` frame, the lines it saw and the gaps between frames' seqs."""
    seen: dict[str, Any] = {"frames": [], "lines": 0, "gaps": 0}
    done = threading.Event()

    def follow() -> None:
        last = None
        with api.follow(run_id) as ws:
            while not done.is_set():
                try:
                    for received, frame in frames(ws, timeout=1.0):
                        if frame.get("type") == "logs":
                            first, last_seq, _, last_ts = frame_span(frame)
                            if last is not None and first != last + 1:
                                seen["gaps"] += 1
                            last = last_seq
                            seen["lines"] += last_seq - first + 1
                            seen["frames"].append(((received - last_ts) * 1000, received))
                        if done.is_set():
                            return
                except TimeoutError:
                    continue

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    try:
        yield seen
    finally:
        done.set()
        thread.join(timeout=5)


class _Cpu:
    """CPU seconds of processes (and their children) since it was made, as % of one core."""

    def __init__(self, pids: list[int]) -> None:
        self.pids = [p for p in pids if p]
        self.started = time.monotonic()
        self.begin = self._seconds()

    def _seconds(self) -> dict[int, float]:
        out: dict[int, float] = {}
        for pid in self.pids:
            try:
                root = psutil.Process(pid)
                for p in [root, *root.children(recursive=True)]:
                    out[p.pid] = _proc_cpu_seconds(p.pid)
            except (psutil.Error, OSError):
                continue
        return out

    def percent(self) -> float | None:
        if not self.pids:
            return None
        end = self._seconds()
        used = sum(seconds - self.begin.get(pid, 0.0) for pid, seconds in end.items())
        return round(100 * used / (time.monotonic() - self.started), 1)


def _proc_cpu_seconds(pid: int) -> float:
    """utime + stime of one process, from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _postgres_pids(tmp: Path) -> list[int]:
    """The embedded Postgres's postmaster (its backends are its children); none when reused."""
    for pidfile in (tmp / "services").rglob("postmaster.pid"):
        with contextlib.suppress(OSError, ValueError, IndexError):
            return [int(pidfile.read_text().split()[0])]
    return []


def metrics_runner_rows(result: dict[str, Any], row: Any) -> None:
    sampler = result.get("sampler")
    if sampler and "error" in sampler:
        row("metrics: a CPU-bound job's slowdown from sampling", sampler["error"][:90], "", False)
    elif sampler:
        # A slowdown within the target is shown only if the jobs' own times agree that closely.
        clear = sampler["spread"] <= SAMPLER_NOISE_LIMIT
        row(
            f"metrics: a CPU-bound job on every core, sampled every 5 s vs not: slowdown (median of {sampler['pairs']} each)",
            f"{sampler['slowdown']:+.2%} ({sampler['sampled_median_s']} vs {sampler['unsampled_median_s']} s)"
            + ("" if clear else f"; inconclusive: the unsampled times spread {sampler['spread']:.0%}"),
            f"≤ {TARGET_SLOWDOWN:.0%}",
            sampler["slowdown"] <= TARGET_SLOWDOWN and clear,
        )
        row("  (info) spread of the unsampled jobs' times (max − min) / median", f"{sampler['spread']:.2%}", "", None)
        row(
            "  (info) CPU samples stored per job: sampled / unsampled",
            " / ".join(", ".join(map(str, sampler["samples"][k])) for k in ("sampled", "unsampled")),
            "",
            None,
        )
    load = result.get("load")
    if load and "error" in load:
        row(f"metrics: {load['runners']} simulated runners against one web process", load["error"][:80], "", False)
    elif load:
        n = load["runners"]
        all_ran = load["running"] == n and not load["closed_by_server"]
        what = (
            f"{LINES_PER_S} lines/s + a {METRICS_EVERY:.0f} s Metrics frame ({GPUS} GPUs)"
            if load["metrics_frames_sent"]
            else f"{LINES_PER_S} lines/s, NO Metrics frames (this server has no metrics ingestion)"
        )
        web = load["cpu_percent"]["web"]
        row(
            f"metrics: {n} simulated runners ({what}), {load['running']} jobs running: web process CPU",
            f"{web} % of one core",
            f"≤ {TARGET_WEB_CPU_PERCENT:.0f} %",
            web is not None and web <= TARGET_WEB_CPU_PERCENT and all_ran and load["metrics_frames_sent"],
        )
        p99 = load["p99_ms"]
        row(
            f"  the same: a follower of one job, log frame latency p99 (p50 {load['p50_ms']} ms, "
            f"{load['follower_frames']} frames, {load['follower_gaps']} gaps)",
            f"{p99} ms" if p99 is not None else "no frames",
            f"≤ {TARGET_FOLLOWER_P99_MS:.0f} ms",
            p99 is not None and p99 <= TARGET_FOLLOWER_P99_MS and not load["follower_gaps"],
        )
        row("  (info) the web process idle, before the runners connected", f"{load['web_idle_percent']} %", "", None)
        if load.get("web_profile"):
            log(f"    the web process's profile over the window: {load['web_profile']}")
        others = ", ".join(f"{k} {v} %" for k, v in load["cpu_percent"].items() if k != "web" and v is not None)
        row("  (info) CPU of the others, % of one core", others, "", None)
        row(
            "  (info) runners connected / jobs running / finished; closed by the server; errors; "
            f"no ack for {ACK_TIMEOUT:.0f} s (a real runner reconnects)",
            f"{load['connected']} / {load['running']} / {load['finished']}; {load['closed_by_server']}; "
            f"{load['error_count']}; {load['ack_timeouts']}",
            f"{n} / {n} / {n}; 0; 0; 0",
            None,
        )
        stored = load["metrics_stored"]
        if stored is not None:
            row(
                "  (info) one job's metrics as the API gives them",
                stored.get("error", "")[:90]
                or f"{stored['system']} system series; training: {', '.join(stored['training']) or 'none'}",
                "",
                None,
            )
        row(
            "  (info) runs ended",
            ", ".join(f"{k} {v}" for k, v in sorted(load["runs_finished"].items())) or "none",
            "",
            None,
        )
        rates, web_s = load["rates"], (web or 0) / 100
        row(
            "  (info) sent per second in the window: log frames (lines) / Metrics frames / heartbeats",
            f"{rates['log_frames']:,.0f} ({rates['lines']:,.0f}) / {rates['metrics_frames']:,.1f} / "
            f"{rates['heartbeats']:,.0f}",
            "",
            None,
        )
        frames_per_s = rates["log_frames"] + rates["metrics_frames"] + rates["heartbeats"]
        if frames_per_s:
            row("  (info) web CPU per frame received", f"{1000 * web_s / frames_per_s:.2f} ms", "", None)
        row(
            "  (info) acks at the runners p50 / p99",
            f"{load['ack_ms']['p50']} / {load['ack_ms']['p99']} ms; {load['log_frames']:,} log frames, "
            f"{load['metrics_frames']:,} metrics frames, {load['heartbeats']:,} heartbeats in all",
            "",
            None,
        )
