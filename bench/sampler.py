"""What the runner's metrics sampler costs a CPU-bound job (bench/README.md,
"Sampler"): the same job (a fixed amount of pure-Python work under bash, as
a runner starts one) timed with and without the sampler following it, in
alternating rounds of one run, and the sampler's own CPU per sample.

The sampler is the runner's own (``trainyard_runner.metrics.JobMetrics``:
the process tree, the working directory's filesystem, the network, the GPUs
and the metrics file, each in a worker thread as in the runner), started on
the job's bash as the runner starts it on the job's shim. Its CPU is this
process's CPU time while it follows the job. A job's slowdown is at most the
share of a core the sampler takes when every core is busy, and about none
when a core is free; the rounds show which one this machine gave.

    .venv/bin/python bench/sampler.py [--rounds 5] [--work 30000000] [--interval 5]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from trainyard_runner import metrics as m
from trainyard_runner import protocol as p

# Prints its own wall time and CPU time once the work is done.
JOB = (
    "import time\n"
    "w, c = time.time(), time.process_time()\n"
    "x = 0\n"
    "for i in range({work}):\n"
    "    x += i\n"
    "print(time.time() - w, time.process_time() - c)\n"
)


def _spec(interval: float) -> p.AssignJob:
    return p.AssignJob(
        job="bench-sampler",
        attempt=1,
        seq_base=0,
        lease="l",
        lease_seconds=10,
        run_name="r",
        workflow="w",
        commands=[],
        env={},
        code=p.CodeSpec(kind="archive"),
        artifacts=[],
        api_url="",
        metrics_interval=interval,
    )


async def one_round(work: int, interval: float | None, tmp: Path) -> dict[str, float]:
    """The job once; with the sampler every ``interval`` s unless None."""
    script = JOB.format(work=work)
    proc = await asyncio.create_subprocess_exec(
        "bash", "-c", f"{sys.executable} -c '{script}'", stdout=asyncio.subprocess.PIPE
    )
    sampler = None
    cpu_before = time.process_time()
    if interval is not None:
        sampler = m.JobMetrics(_spec(interval), metrics_file=tmp / "metrics.jsonl", work=tmp)
        sampler.start(proc.pid)
    out, _ = await proc.communicate()
    samples = 0
    if sampler is not None:
        await sampler.finish()
        frame = sampler.frame(final=True)
        samples = len(frame.system) if frame is not None else 0
    wall, cpu = map(float, out.split())
    return {"wall": wall, "cpu": cpu, "sampler_cpu": time.process_time() - cpu_before, "samples": samples}


async def bench(rounds: int, work: int, interval: float) -> dict[str, object]:
    with tempfile.TemporaryDirectory() as tmp:
        await one_round(work // 10, None, Path(tmp))  # warm the caches
        without: list[dict[str, float]] = []
        with_: list[dict[str, float]] = []
        for _ in range(rounds):
            without.append(await one_round(work, None, Path(tmp)))
            with_.append(await one_round(work, interval, Path(tmp)))
        # The sampler's own cost per sample, measured without a job to compete with.
        sampler = m.JobMetrics(_spec(interval), metrics_file=Path(tmp) / "metrics.jsonl", work=Path(tmp))
        sleeper = await asyncio.create_subprocess_exec("bash", "-c", "sleep 30 & sleep 30 & wait")
        sampler.start(sleeper.pid)
        await sampler.finish()
        started = time.process_time()
        for _ in range(50):
            sampler.sample()
        per_sample = (time.process_time() - started) / 50
        sleeper.kill()
        await sleeper.wait()
    wall_without = statistics.median(r["wall"] for r in without)
    wall_with = statistics.median(r["wall"] for r in with_)
    sampled_seconds = sum(r["wall"] for r in with_)
    return {
        "rounds": rounds,
        "interval_s": interval,
        "job_wall_s_without": [round(r["wall"], 3) for r in without],
        "job_wall_s_with": [round(r["wall"], 3) for r in with_],
        "job_cpu_s_without": [round(r["cpu"], 3) for r in without],
        "job_cpu_s_with": [round(r["cpu"], 3) for r in with_],
        "median_slowdown_pct": round((wall_with / wall_without - 1) * 100, 2),
        "samples": int(sum(r["samples"] for r in with_)),
        "sampler_cpu_ms_per_sample": round(per_sample * 1000, 3),
        "sampler_share_of_a_core_pct": round(per_sample / interval * 100, 4),
        "sampler_cpu_s_while_following": round(sum(r["sampler_cpu"] for r in with_), 3),
        "followed_s": round(sampled_seconds, 1),
        "gpus": _gpu_way(),
    }


def _gpu_way() -> str:
    gpus = m.Gpus()
    gpus.read()
    return gpus.way or "none"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--work", type=int, default=30_000_000, help="loop iterations of the job")
    parser.add_argument("--interval", type=float, default=5.0, help="seconds between samples")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(bench(args.rounds, args.work, args.interval)), indent=2))


if __name__ == "__main__":
    main()
