"""This host's CPUs, memory, free disk and GPUs: the ``local`` backend's one
offer when no shapes are configured.

Probed with os, shutil and ``nvidia-smi`` rather than the runner's
``trainyard_runner.resources`` (the backend imports only the runner's
protocol). The numbers are the ones the runner's Hello reports: ``os.cpu_count()``,
physical memory, free disk of the runners' directory.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from functools import lru_cache
from pathlib import Path

from backend.clouds.backends.base import Gpu

log = logging.getLogger(__name__)

NVIDIA_SMI_TIMEOUT = 10.0


def host_cpus() -> int:
    return os.cpu_count() or 1


def host_memory_bytes() -> int:
    """Physical memory (the kernel's MemTotal); 0 when it cannot be read."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (OSError, ValueError):
        return 0


def free_disk_bytes(path: Path) -> int:
    """Free space on the file system of ``path`` (or of its nearest existing parent)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return shutil.disk_usage(candidate).free
    return 0


@lru_cache(maxsize=1)
def host_gpus() -> tuple[Gpu, ...]:
    """GPUs from ``nvidia-smi``, probed once per process (it can take seconds);
    none without it, or when it fails or times out."""
    if shutil.which("nvidia-smi") is None:
        return ()
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT,
            check=True,
        ).stdout
    except (subprocess.SubprocessError, OSError) as exc:
        log.warning("nvidia-smi failed, the local backend offers no GPUs: %s", exc)
        return ()
    return parse_nvidia_smi(out)


def parse_nvidia_smi(out: str) -> tuple[Gpu, ...]:
    """``name, memory MiB`` lines, as the runner parses them."""
    gpus = []
    for line in out.splitlines():
        name, _, mib = line.rpartition(",")
        if name.strip() and mib.strip().isdigit():
            gpus.append(Gpu(name=name.strip(), memory_bytes=int(mib.strip()) * 2**20))
    return tuple(gpus)
