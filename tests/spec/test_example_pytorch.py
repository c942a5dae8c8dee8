"""examples/pytorch-cifar as a user copies it: its workflows load without a
warning, ``train`` plans one job on one GPU with torch's CUDA build and
``train-cpu`` one without a GPU with the CPU build, both reading CIFAR-10 as
a checked input and resuming from ./checkpoint. The last test runs the
script itself on a tiny archive, in a virtualenv of its own with torch's CPU
build (kept under the data folder for the next run; the suite's own venv has
no torch)."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
from trainyard_spec import Source, WorkflowsFile, find_workflows_files, load_workflows, resolve_run_plan

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "pytorch-cifar"
CIFAR = {
    "uri": "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",
    "sha256": "c4a38c50a1bc5f3a1c5537f2155ab9d68f9f25eb1ed8d9ddda3db29a59bca1dd",
}


def example() -> WorkflowsFile:
    files = find_workflows_files(EXAMPLE)
    return load_workflows([Source(p.relative_to(EXAMPLE).as_posix(), p.read_text()) for p in files])


def test_the_example_loads_without_a_warning() -> None:
    file = example()

    assert (list(file.workflows), file.warnings, file.ignored) == (["train", "train-cpu"], [], [])


@pytest.mark.parametrize(
    ("workflow", "gpus", "requirements", "index", "torch"),
    [
        ("train", 1, "requirements-cuda.txt", "https://download.pytorch.org/whl/cu124", "torch==2.5.1+cu124"),
        ("train-cpu", 0, "requirements-cpu.txt", "https://download.pytorch.org/whl/cpu", "torch==2.5.1+cpu"),
    ],
)
def test_it_plans_with_a_gpu_and_without(workflow: str, gpus: int, requirements: str, index: str, torch: str) -> None:
    [job] = resolve_run_plan(example(), workflow, env_overrides={}).jobs

    assert (job.resources.gpu_count, job.commands) == (gpus, ["python train.py"])
    assert job.environment == {"requirements": requirements}
    assert job.env["UV_EXTRA_INDEX_URL"] == index  # where uv finds the pinned build while it builds the environment
    pins = [line for line in (EXAMPLE / requirements).read_text().splitlines() if line.startswith("torch")]
    assert pins == [torch]
    assert [{k: entry[k] for k in CIFAR} for entry in job.data] == [CIFAR]
    assert (job.checkpoint, job.artifacts) == ("./checkpoint", ["./model"])


def test_trainyard_workflows_lists_both_with_their_resources(tmp_path: Path) -> None:
    copy = tmp_path / "pytorch-cifar"
    shutil.copytree(EXAMPLE, copy)
    trainyard = Path(sys.executable).parent / "trainyard"

    listed = subprocess.run(
        [str(trainyard), "workflows", "--json"], cwd=copy, capture_output=True, text=True, timeout=60, check=False
    )

    assert (listed.returncode, listed.stderr) == (0, ""), listed.stderr
    entries = {e["name"]: e for e in json.loads(listed.stdout)}
    assert {name: e["resources"]["gpu_count"] for name, e in entries.items()} == {"train": 1, "train-cpu": 0}
    assert entries["train"]["placement"]["spot_policy"] == "auto"


def test_the_gpu_workflow_runs_on_spot_and_comes_back_after_an_interruption() -> None:
    train = example().workflows["train"]

    assert train.placement()["spot_policy"] == "auto"
    assert train.retry is not None
    assert (train.retry.on_events, train.retry.limit) == (["interruption", "instance_lost"], 3)


def _cifar_archive(path: Path, images: int) -> None:
    """An archive in CIFAR-10's binary form: a label byte and 3,072 pixel
    bytes a record, five training batches and a test batch."""
    with tarfile.open(path, "w:gz") as tar:
        for name in [*(f"data_batch_{i}.bin" for i in range(1, 6)), "test_batch.bin"]:
            data = b"".join(bytes([i % 10]) + bytes([(i * 7 + j) % 256 for j in range(3072)]) for i in range(images))
            member = tarfile.TarInfo(f"cifar-10-batches-bin/{name}")
            member.size = len(data)
            tar.addfile(member, io.BytesIO(data))


TORCH = "torch==2.13.0+cpu"


@pytest.fixture(scope="module")
def torch_python() -> Path:
    """A Python with torch's CPU build: made once, then reused. pip finds the
    wheel where the machine's pip configuration says (a local wheel folder
    here; elsewhere set PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu)."""
    data = Path(os.environ.get("TRAINYARD_DATA_DIR") or EXAMPLE.parents[1] / ".trainyard-data")
    venv = data / "test-venvs" / TORCH.replace("==", "-")
    python = venv / "bin" / "python"
    if python.exists():
        return python
    building = venv.with_name(venv.name + f".building-{os.getpid()}")
    shutil.rmtree(building, ignore_errors=True)
    subprocess.run([sys.executable, "-m", "venv", str(building)], check=True, timeout=120)
    pip = subprocess.run(
        [str(building / "bin" / "pip"), "install", "--quiet", "--disable-pip-version-check", TORCH],
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    if pip.returncode != 0:
        shutil.rmtree(building, ignore_errors=True)
        pytest.fail(f"could not install {TORCH} for the example's script: {pip.stderr[-2000:]}")
    shutil.rmtree(venv, ignore_errors=True)
    building.rename(venv)  # its python runs from the new path (only pip's script names the old one)
    return python


@pytest.mark.slow
def test_the_script_trains_checkpoints_reports_and_resumes(tmp_path: Path, torch_python: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    _cifar_archive(work / "cifar-10-binary.tar.gz", images=32)
    metrics = tmp_path / "metrics.jsonl"
    env = {**os.environ, "BATCH_SIZE": "16", "TRAINYARD_METRICS_FILE": str(metrics)}

    def train(epochs: int, **more: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(torch_python), str(EXAMPLE / "train.py")],
            cwd=work,
            env={**env, "EPOCHS": str(epochs), **more},
            capture_output=True,
            text=True,
            timeout=300,
        )

    first = train(2)
    assert first.returncode == 0, first.stderr
    assert "epoch   2/2" in first.stdout and (work / "model" / "cifar-cnn.pt").is_file()
    assert [p.name for p in (work / "checkpoint").iterdir()] == ["state.pt"]  # the temporary file was renamed
    reported = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [r["step"] for r in reported if "test_accuracy" in r] == [10, 20]  # 160 images / 16 a step, each epoch

    resumed = train(3, TRAINYARD_RESUMED="1", TRAINYARD_ATTEMPT="2")
    assert resumed.returncode == 0, resumed.stderr
    assert "resuming from epoch 2 (attempt 2)" in resumed.stdout
    assert "epoch   1/" not in resumed.stdout and "epoch   3/3" in resumed.stdout
