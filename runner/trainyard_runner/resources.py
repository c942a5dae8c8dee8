"""What this machine offers, for ``Hello``."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path

from .protocol import MAX_GPUS, Gpu, Resources

log = logging.getLogger(__name__)

# A backend that starts runners with fake machine shapes (the local and fake
# backends, for tests) declares the shape here as Resources JSON.
RESOURCES_VAR = "TRAINYARD_RUNNER_RESOURCES"


def detect_resources(work_dir: Path, *, gpus: list[Gpu] | None = None) -> Resources:
    """CPUs, memory, free disk of ``work_dir`` and GPUs (detected unless given),
    or exactly what ``TRAINYARD_RUNNER_RESOURCES`` declares when it is set."""
    declared = declared_resources()
    if declared is not None:
        return declared
    return Resources(
        cpus=os.cpu_count() or 1,
        memory_bytes=memory_bytes(),
        disk_bytes=shutil.disk_usage(work_dir).free,
        gpus=detect_gpus() if gpus is None else gpus,
    )


def declared_resources() -> Resources | None:
    """``TRAINYARD_RUNNER_RESOURCES`` parsed; None when unset. Raises
    ``ValueError`` (a pydantic ``ValidationError``) when it is not valid."""
    raw = os.environ.get(RESOURCES_VAR, "").strip()
    return Resources.model_validate_json(raw) if raw else None


def memory_bytes(meminfo: Path = Path("/proc/meminfo")) -> int:
    """MemTotal in bytes; 0 when it cannot be read (not Linux)."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024  # the value is in kB
    except (OSError, ValueError, IndexError):
        pass
    return 0


def detect_gpus() -> list[Gpu]:
    """GPUs reported by ``nvidia-smi``; [] without it or when it fails."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=15,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError) as e:
        log.warning("nvidia-smi failed, reporting no GPUs: %s", e)
        return []
    return parse_nvidia_smi(out)


def parse_nvidia_smi(out: str) -> list[Gpu]:
    """Parse ``name, memory MiB`` lines: the first ``MAX_GPUS`` GPUs, as many
    as a ``Hello`` may name (a name longer than the protocol's bound is cut)."""
    result = []
    for line in out.splitlines():
        name, _, mib = line.rpartition(",")
        if name.strip() and mib.strip().isdigit():
            result.append(Gpu(name=name.strip(), memory_bytes=int(mib.strip()) * 1024 * 1024))
    if len(result) > MAX_GPUS:
        log.warning("nvidia-smi lists %d GPUs: reporting the first %d", len(result), MAX_GPUS)
    return result[:MAX_GPUS]
