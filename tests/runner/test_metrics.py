"""A job's metrics on the runner (runner/trainyard_runner/metrics.py): system
samples of its process tree and the GPUs (a stand-in ``nvidia-smi``: no GPU
here, NVML absent), training values from its log lines and its metrics file,
the per-minute cap, the frames and their buffering across a lost
connection. End to end through a real runner process and the fake server of
test_agent; the parsers also on their own."""

from __future__ import annotations

import asyncio
import itertools
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from trainyard_runner import metrics as m
from trainyard_runner import protocol as p
from trainyard_runner.resources import detect_gpus
from websockets.asyncio.server import serve

from tests.runner.test_agent import FakeServer, assign, start_runner, stop
from tests.support.burn import BURN, assert_cpu_is_what_the_job_got
from tests.support.gpus import gpu, set_gpus, stand_in_nvidia_smi

# ---------------------------------------------------------------- the stand-in nvidia-smi and the GPU readers


def _path_with(bin_dir: Path | None) -> str:
    """This PATH without any folder holding an nvidia-smi, ``bin_dir`` first."""
    kept = [d for d in os.environ["PATH"].split(os.pathsep) if d and not (Path(d) / "nvidia-smi").exists()]
    return os.pathsep.join([str(bin_dir), *kept] if bin_dir is not None else kept)


def test_the_stand_in_answers_the_resource_query_and_the_sampling_query_from_its_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = stand_in_nvidia_smi(
        tmp_path / "bin",
        [gpu("NVIDIA A100-SXM4-80GB", util=97, mem_used_mib=70000, mem_total_mib=81920), gpu(power_w=None)],
    )
    monkeypatch.setenv("PATH", _path_with(tmp_path / "bin"))
    assert [(g.name, g.memory_bytes) for g in detect_gpus()] == [
        ("NVIDIA A100-SXM4-80GB", 81920 * m.MIB),
        ("NVIDIA A10G", 23028 * m.MIB),
    ]
    gpus = m.Gpus()
    first = gpus.read()
    assert gpus.way == "smi"  # nvidia-ml-py imports, but without a driver NVML does not initialise
    assert first == [
        p.GpuSample(index=0, util=97, mem_used=70000 * m.MIB, mem_total=81920 * m.MIB, power_w=60.5, temp_c=41),
        p.GpuSample(index=1, util=0, mem_used=0, mem_total=23028 * m.MIB, power_w=None, temp_c=41),
    ]
    set_gpus(state, [gpu(util=12.5, mem_used_mib=100)])
    assert [(g.index, g.util, g.mem_used) for g in gpus.read()] == [(0, 12.5, 100 * m.MIB)]
    wrong = subprocess.run([str(tmp_path / "bin" / "nvidia-smi"), "-L"], capture_output=True, text=True)
    assert wrong.returncode == 2 and "answers only --query-gpu" in wrong.stderr


def test_without_nvidia_smi_or_nvml_there_are_no_gpus_and_no_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", _path_with(None))
    gpus = m.Gpus()
    assert gpus.read() == [] and gpus.way == "none"


def test_nvidia_smi_fields_that_are_not_numbers() -> None:
    out = "0, 55, 1000, 24000, [N/A], 50\n1, [N/A], 0, 24000, 70.1, 40\n2, 3, 10, 24000, 71.0, [Not Supported]\nbad line\n"
    assert m.parse_smi_samples(out) == [
        p.GpuSample(index=0, util=55, mem_used=1000 * m.MIB, mem_total=24000 * m.MIB, power_w=None, temp_c=50),
        p.GpuSample(index=2, util=3, mem_used=10 * m.MIB, mem_total=24000 * m.MIB, power_w=71.0, temp_c=None),
    ]


# ---------------------------------------------------------------- training values: the parsers


def test_log_patterns_take_the_value_group_or_the_first_and_the_step_group() -> None:
    patterns = m.LogPatterns(
        [
            p.MetricPattern(name="loss", regex=r"loss[ =]([0-9.eE+-]+)"),
            p.MetricPattern(name="acc", regex=r"step (?P<step>\d+) .*acc=(?P<value>\S+)"),
        ]
    )
    values = patterns.values(["epoch 1 loss 0.25", "step 7 loss=0.5 acc=0.9", "loss nan-ish", "acc=x"], 1.5)
    assert [(v.name, v.value, v.step, v.source) for v in values] == [
        ("loss", 0.25, None, "log"),
        ("loss", 0.5, None, "log"),
        ("acc", 0.9, 7, "log"),
    ]


def test_metrics_file_lines() -> None:
    now = time.time()
    good = m.parse_file_line(b'{"step": 100, "loss": 0.31, "acc": 0.9, "phase": "train", "time": 12.5}', now)
    assert good is not None
    assert [(v.name, v.value, v.step, v.t, v.source) for v in good] == [
        ("loss", 0.31, 100, now, "file"),
        ("acc", 0.9, 100, now, "file"),
    ]  # a "time" that is no unix time (seconds since the start) leaves the read time
    stamped = m.parse_file_line(b'{"loss": 1, "timestamp": 1700000000.5, "step": 3.0}', now)
    assert stamped is not None and [(v.value, v.step, v.t) for v in stamped] == [(1.0, 3, 1700000000.5)]
    for bad in (
        b"not json",
        b"[1, 2]",
        b'{"step": -1, "loss": 1}',
        b'{"step": 1.5, "loss": 1}',
        b'{"step": 1}',  # no value at all
        b'{"phase": "eval"}',
        b'{"cpu": 3}',  # a system metric's name
        b'{"bad name": 3}',
        b'{"loss": true}',
        b"x" * (m.MAX_FILE_LINE_BYTES + 1),
    ):
        assert m.parse_file_line(bad, now) is None, bad


def test_values_without_a_step_read_together_get_times_of_their_own(tmp_path: Path) -> None:
    spec = p.AssignJob.model_validate(
        {**assign("timed", [], (tmp_path, "c")), "metrics": [{"name": "loss", "regex": "loss (.+)"}]}
    )
    metrics = m.JobMetrics(spec, metrics_file=tmp_path / "none.jsonl", work=tmp_path)
    metrics.lines(["loss 3", "loss 2", "loss 1"])  # one chunk of output: read at one time
    metrics._add([p.TrainingValue(name="loss", value=0.5, t=1.0, source="file")])  # a file line's own, earlier time
    metrics._add([p.TrainingValue(name="acc", value=0.5, step=4, t=1.0, source="file")])  # a step: its time is kept
    frame = metrics.frame()
    assert frame is not None
    times = [v.t for v in frame.training if v.name == "loss"]
    assert [v.value for v in frame.training if v.name == "loss"] == [3, 2, 1, 0.5]
    assert times == sorted(set(times)) and round(times[-1] - times[0], 3) == 3 * m.TIME_STEP
    assert [v.t for v in frame.training if v.name == "acc"] == [1.0]


def test_lines_read_after_the_commands_ended_still_give_their_values(tmp_path: Path) -> None:
    """The log's last lines are read after the process exits (and after
    ``finish``): the last epoch's value is in the attempt's last frame."""
    spec = p.AssignJob.model_validate(
        {
            **assign("last", [], (tmp_path, "c")),
            "metrics": [{"name": "loss", "regex": r"epoch (?P<step>\d+) loss (?P<value>\S+)"}],
        }
    )
    metrics = m.JobMetrics(spec, metrics_file=tmp_path / "none.jsonl", work=tmp_path)
    metrics.lines(["epoch 39 loss 0.2"])
    asyncio.run(metrics.finish())
    metrics.lines(["epoch 40 loss 0.1"])
    frame = metrics.frame(final=True)
    assert frame is not None and [(v.step, v.value) for v in frame.training] == [(39, 0.2), (40, 0.1)]


def test_the_per_minute_cap_drops_and_counts_the_excess(tmp_path: Path) -> None:
    spec = p.AssignJob.model_validate({**assign("capped", [], (tmp_path, "c")), "metrics_per_minute": 5})
    metrics = m.JobMetrics(spec, metrics_file=tmp_path / "none.jsonl", work=tmp_path)
    metrics.lines([])  # no pattern: nothing read
    values = [p.TrainingValue(name="loss", value=i, step=i, t=1.0, source="file") for i in range(8)]
    metrics._add(values)
    frame = metrics.frame()
    assert frame is not None and [v.step for v in frame.training] == [0, 1, 2, 3, 4] and frame.dropped == 3
    metrics.sent(frame)
    assert not metrics.pending() and metrics.frame() is None


# ---------------------------------------------------------------- the process tree


def _cpu_seconds(pid: int) -> float:
    """utime + stime of ``pid`` from /proc (not through psutil: the reference the sampler is checked against)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _tree_cpu_seconds(root: int) -> float:
    """``_cpu_seconds`` of ``root`` and its children."""
    children = Path(f"/proc/{root}/task/{root}/children").read_text().split()
    return sum(_cpu_seconds(pid) for pid in [root, *map(int, children)])


def test_the_tree_sampler_reads_what_a_busy_child_gets_of_one_core_and_its_memory() -> None:
    """The tree is a shell waiting for a busy child (not the test's own
    process, whose threads would count too), measured over the same window."""
    busy = "import time\nb = b'x' * (80 << 20)\nt = time.time()\nwhile time.time() - t < 4: pass"
    burn = subprocess.Popen(["sh", "-c", f'"{sys.executable}" -c "$0"; true', busy])
    try:
        time.sleep(0.3)
        sampler = m.TreeSampler(burn.pid)
        sampler.sample()
        before, start = _tree_cpu_seconds(burn.pid), time.monotonic()
        time.sleep(2)
        cpu, rss = sampler.sample()
        got = (_tree_cpu_seconds(burn.pid) - before) / (time.monotonic() - start) * 100
    finally:
        subprocess.run(["pkill", "-KILL", "-P", str(burn.pid)], check=False)
        burn.kill()
        burn.wait()
    # Near 100 % on an idle machine; on a busy one, what the child got.
    assert got > 1 and abs(cpu - got) <= 10, (cpu, got)
    assert rss >= 80 << 20


# ---------------------------------------------------------------- through a real runner


def _metrics_job(repo: tuple[Path, str], name: str, seconds: float, **extra: Any) -> dict[str, Any]:
    """A job of ``repo`` burning one core for ``seconds`` (a commit that adds the script)."""
    path, _ = repo
    (path / "burn.py").write_text(BURN)
    subprocess.run(["git", "-C", str(path), "add", "burn.py"], check=True)
    subprocess.run(["git", "-C", str(path), "commit", "-qm", "burn"], check=True)
    commit = subprocess.run(["git", "-C", str(path), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    job = assign(name, [f"{sys.executable} burn.py"], (path, commit.strip()))
    job["env"] = {"SECONDS_TO_BURN": str(seconds)}
    job["metrics"] = [{"name": "loss", "regex": r"step (?P<step>\d+) loss (?P<value>[0-9.]+)"}]
    job["metrics_interval"] = 1
    job.update(extra)
    return job


def _frames(server: FakeServer, job: str) -> list[dict[str, Any]]:
    return [f for f in server.received if f["type"] == "metrics" and f["job"] == job]


def _final_index(server: FakeServer, job: str) -> int:
    return next(
        i for i, f in enumerate(server.received) if f.get("job") == job and f.get("state") in ("succeeded", "failed")
    )


async def _run(tmp_path: Path, job: dict[str, Any], path: str, during: Any = None) -> FakeServer:
    server = FakeServer()
    async with serve(server.handler, "127.0.0.1", 0) as ws_server:
        port = ws_server.sockets[0].getsockname()[1]
        runner = await start_runner(port, tmp_path / "rd", env={"PATH": path})
        try:
            await server.wait_for(lambda: server.hellos, 10)
            await server.to_send.put(job)
            if during is not None:
                await during(server)
            await server.wait_for(lambda: ("succeeded", 0) in server.states(job["job"]), 60)
        finally:
            await stop(runner)
    return server


def test_a_busy_job_sends_samples_near_one_core_with_rising_memory_both_gpus_and_its_training_values(
    tmp_path: Path, repo: tuple[Path, str]
) -> None:
    state = stand_in_nvidia_smi(tmp_path / "bin", [gpu(util=88, mem_used_mib=5000), gpu(util=91, mem_used_mib=6000)])
    job = _metrics_job(repo, "busy", 5)

    async def busy_gpus_later(server: FakeServer) -> None:
        # Half way through (2.5 s in; the first sample is at 1 s) the GPUs go idle.
        await server.wait_for(lambda: any(t.startswith("step 6 ") for _, _, t in server.stored.get("busy", [])), 20)
        set_gpus(state, [gpu(util=5, mem_used_mib=5000), gpu(util=6, mem_used_mib=6000)])

    server = asyncio.run(_run(tmp_path, job, _path_with(tmp_path / "bin"), busy_gpus_later))
    frames = _frames(server, "busy")
    samples = [s for f in frames for s in f["system"]]
    assert len(samples) >= 3, samples
    assert_cpu_is_what_the_job_got(samples, [t for _, _, t in server.stored["busy"]])
    rss = [s["rss"] for s in samples]
    assert rss[-1] >= rss[0] + (16 << 20) and rss == sorted(rss[:-1]) + rss[-1:], rss
    assert [s["t"] for s in samples] == sorted(s["t"] for s in samples)
    assert all(s["disk_total"] > 0 and 0 < s["disk_used"] <= s["disk_total"] for s in samples)
    assert all([g["index"] for g in s["gpus"]] == [0, 1] for s in samples)
    assert samples[0]["gpus"][1] == {
        "index": 1,
        "util": 91.0,
        "mem_used": 6000 * m.MIB,
        "mem_total": 23028 * m.MIB,
        "power_w": 60.5,
        "temp_c": 41.0,
    }
    assert samples[-1]["gpus"][0]["util"] == 5.0  # the state is read at every sample
    training = [v for f in frames for v in f["training"]]
    losses = [(v["step"], v["value"]) for v in training if v["name"] == "loss"]
    steps = len(losses)
    assert steps >= 5 and losses == [(i, round(1 / i, 4)) for i in range(1, steps + 1)]
    accs = [(v["step"], v["value"], v["source"]) for v in training if v["name"] == "acc"]
    assert accs == [(i, i / 100, "file") for i in range(1, steps + 1)] + [(999, 1.0, "file")]
    assert sum(f["malformed"] for f in frames) == 1 and sum(f["dropped"] for f in frames) == 0
    # At most one frame every 5 s; the last (at least a second after the one before) before the final state.
    sent_at = [i for i, f in enumerate(server.received) if f["type"] == "metrics"]
    assert sent_at[-1] < _final_index(server, "busy")
    assert len(frames) <= 2 + 7 // m.FRAME_SECONDS
    lines = [t for _, _, t in server.stored["busy"]]
    metrics_file = lines[0].removeprefix("metrics file: ")
    assert metrics_file.endswith("/jobs/busy/metrics/metrics.jsonl") and "/work/" not in metrics_file
    assert lines[1] == "wandb: busy allow"


def test_without_a_gpu_the_samples_carry_none_and_the_cap_counts_what_it_drops(
    tmp_path: Path, repo: tuple[Path, str]
) -> None:
    job = _metrics_job(repo, "nogpu", 3, metrics_per_minute=3)
    job["env"]["WANDB_RUN_ID"] = "mine"  # the job's own wins
    server = asyncio.run(_run(tmp_path, job, _path_with(None)))
    frames = _frames(server, "nogpu")
    samples = [s for f in frames for s in f["system"]]
    assert samples and all(s["gpus"] == [] for s in samples)
    training = [v for f in frames for v in f["training"]]
    assert len(training) == 3  # steps 1…: loss and acc interleave as they are read
    produced = 2 * len([t for _, _, t in server.stored["nogpu"] if t.startswith("step ")]) + 1
    assert sum(f["dropped"] for f in frames) == produced - 3
    assert "wandb: mine allow" in [t for _, _, t in server.stored["nogpu"]]


def test_samples_taken_while_the_server_is_away_arrive_after_the_reconnect(
    tmp_path: Path, repo: tuple[Path, str]
) -> None:
    job = _metrics_job(repo, "away", 9)

    async def go_away(server: FakeServer) -> None:
        await server.wait_for(lambda: _frames(server, "away"), 20)
        server.refuse_hellos = [(1013, "try again later")] * 2
        assert server.current is not None
        await server.current.close(1012, "restart")
        await server.wait_for(lambda: server.connections >= 4, 30)

    server = asyncio.run(_run(tmp_path, job, _path_with(None), go_away))
    frames = _frames(server, "away")
    times = [s["t"] for f in frames for s in f["system"]]
    assert times == sorted(times) and len(times) >= 7, times
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert max(gaps) < 2.5, gaps  # every second: none lost while disconnected
    assert max(len(f["system"]) for f in frames) >= 3  # the ones kept for the reconnect came in one frame


def test_docker_jobs_get_their_metrics_folder_mounted(tmp_path: Path) -> None:
    from trainyard_runner import docker

    argv = docker.run_argv(
        job="j",
        work=tmp_path / "w",
        env_file=tmp_path / "e",
        image="busybox",
        script="true",
        metrics_dir=tmp_path / "m",
    )
    assert argv[argv.index(f"{tmp_path}/m:{docker.METRICS_MOUNT}") - 1] == "-v"
