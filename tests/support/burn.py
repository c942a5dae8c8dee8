"""A job that burns one core and grows its memory, and the check that the
samples' CPU is what it got (tests of the runner's metrics: tests/runner/test_metrics.py,
tests/e2e/test_metrics_runner.py).

``BURN`` is a Python script: for ``$SECONDS_TO_BURN`` seconds it spins, and
every half second it adds 8 MiB it writes (resident), prints ``step N loss
1/N`` and ``cpu <unix time> <its process_time>``, and appends
``{"step": N, "acc": N/100}`` to ``$TRAINYARD_METRICS_FILE``; at the end one
line that is no JSON and one last line without its newline. First it prints
the metrics file's path and ``WANDB_RUN_ID``/``WANDB_RESUME``.
"""

from __future__ import annotations

import itertools
from typing import Any

BURN = r"""
import json, os, time
print("metrics file:", os.environ["TRAINYARD_METRICS_FILE"])
print("wandb:", os.environ["WANDB_RUN_ID"], os.environ["WANDB_RESUME"])
blobs, start, step = [], time.time(), 0
with open(os.environ["TRAINYARD_METRICS_FILE"], "a") as f:
    while time.time() - start < float(os.environ["SECONDS_TO_BURN"]):
        x = 0
        for i in range(300000):
            x += i
        if time.time() - start > len(blobs) * 0.5:
            blobs.append(b"x" * (8 << 20))  # written: resident
            step += 1
            print(f"step {step} loss {1 / step:.4f}", flush=True)
            print(f"cpu {time.time():.3f} {time.process_time():.3f}", flush=True)
            f.write(json.dumps({"step": step, "acc": step / 100}) + "\n")
            f.flush()
    f.write("this line is no JSON\n")
    f.write('{"step": 999, "acc": 1.0}')  # the last line, without its newline
"""


def assert_cpu_is_what_the_job_got(samples: list[dict[str, Any]], lines: list[str]) -> None:
    """The samples' CPU is the CPU time the job had: near 100 % of one core on
    an idle machine, what it got on a busy one (the tests' own). The job
    printed ``cpu <unix time> <its process_time>`` every half second; a
    sample's CPU covers the time since the sample before."""
    marks = [tuple(map(float, line.split()[1:])) for line in lines if line.startswith("cpu ")]

    def used_by(t: float) -> float:
        for (t0, c0), (t1, c1) in itertools.pairwise(marks):
            if t0 <= t <= t1:
                return c0 + (c1 - c0) * (t - t0) / (t1 - t0)
        raise AssertionError(f"{t} is outside the job's marks")

    inside = [
        i for i in range(1, len(samples)) if marks[0][0] <= samples[i - 1]["t"] and samples[i]["t"] <= marks[-1][0]
    ]
    assert inside, (samples, marks)
    first, last = inside[0], inside[-1]
    sampled = sum(samples[i]["cpu"] * (samples[i]["t"] - samples[i - 1]["t"]) for i in range(first, last + 1)) / 100
    span = samples[last]["t"] - samples[first - 1]["t"]
    used = used_by(samples[last]["t"]) - used_by(samples[first - 1]["t"])
    assert used > 0.01 * span and abs(sampled - used) <= 0.1 * span + 0.1, (sampled, used, span)
