"""The names of a job's system series and what a sample says of each
(docs/METRICS.md): ``cpu``, ``memory`` (the process tree's resident bytes),
the working directory's disk, the machine's network, and per GPU
``gpu<i>.util``, ``.memory``, ``.memory_total``, ``.power``, ``.temperature``."""

from __future__ import annotations

import math

from trainyard_runner import protocol

UNITS = {
    "cpu": "%",
    "memory": "B",
    "disk_used": "B",
    "disk_total": "B",
    "net_rx": "B/s",
    "net_tx": "B/s",
    "util": "%",
    "memory_total": "B",
    "power": "W",
    "temperature": "°C",
}


def unit_of(name: str) -> str:
    """The unit of a system series (``gpu3.power`` → ``W``)."""
    return UNITS.get(name.split(".", 1)[-1], "")


def sample_values(sample: protocol.SystemSample) -> dict[str, float]:
    """One sample as {series name: value}; a GPU's missing power or
    temperature is NaN."""
    out = {
        "cpu": sample.cpu,
        "memory": float(sample.rss),
        "disk_used": float(sample.disk_used),
        "disk_total": float(sample.disk_total),
        "net_rx": sample.net_rx,
        "net_tx": sample.net_tx,
    }
    for gpu in sample.gpus:
        prefix = f"gpu{gpu.index}."
        out[prefix + "util"] = gpu.util
        out[prefix + "memory"] = float(gpu.mem_used)
        out[prefix + "memory_total"] = float(gpu.mem_total)
        out[prefix + "power"] = math.nan if gpu.power_w is None else gpu.power_w
        out[prefix + "temperature"] = math.nan if gpu.temp_c is None else gpu.temp_c
    return out


def is_gpu_util(name: str) -> bool:
    return name.startswith("gpu") and name.endswith(".util")


def order_key(name: str) -> tuple[int, int, str]:
    """Machine series first in their protocol order, then GPUs by index, each GPU's in protocol order."""
    if name in protocol.SYSTEM_METRICS:
        return (0, protocol.SYSTEM_METRICS.index(name), "")
    index, _, metric = name[3:].partition(".")
    rank = protocol.GPU_METRICS.index(metric) if metric in protocol.GPU_METRICS else len(protocol.GPU_METRICS)
    return (1, int(index) if index.isdigit() else 0, f"{rank:02d}{metric}")
