"""A stand-in ``nvidia-smi`` for machines without a GPU (docs/METRICS.md).

``stand_in_nvidia_smi(bin_dir, gpus)`` writes an executable ``nvidia-smi``
into ``bin_dir`` and returns the JSON state file it answers from: a list of
GPUs, each ``{"name", "util", "mem_used_mib", "mem_total_mib", "power_w",
"temp_c"}``. It answers any ``--query-gpu=<fields> --format=csv,noheader,nounits``
over those fields (the runner's resource query ``name,memory.total`` and its
sampling query ``index,utilization.gpu,memory.used,memory.total,power.draw,temperature.gpu``),
one line per GPU, as the real one does; a field a GPU lacks (or that is None)
reads ``[N/A]``. The state is read again at every call, so ``set_gpus`` changes
what a running job's samples show. A test puts ``bin_dir`` first on the PATH
of the runner it starts.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

STATE_NAME = "nvidia-smi.json"

_SCRIPT = """\
#!{python}
import json, sys

FIELDS = {{
    "index": None,
    "name": "name",
    "utilization.gpu": "util",
    "memory.used": "mem_used_mib",
    "memory.total": "mem_total_mib",
    "power.draw": "power_w",
    "temperature.gpu": "temp_c",
}}
args = sys.argv[1:]
query = [a.split("=", 1)[1] for a in args if a.startswith("--query-gpu=")]
if len(query) != 1 or "--format=csv,noheader,nounits" not in args:
    sys.stderr.write("stand-in nvidia-smi answers only --query-gpu=... --format=csv,noheader,nounits\\n")
    sys.exit(2)
fields = query[0].split(",")
unknown = [f for f in fields if f not in FIELDS]
if unknown:
    sys.stderr.write("Field \\"%s\\" is not a valid field to query.\\n" % unknown[0])
    sys.exit(2)
with open({state!r}) as f:
    gpus = json.load(f)
for i, gpu in enumerate(gpus):
    values = []
    for field in fields:
        value = i if field == "index" else gpu.get(FIELDS[field])
        values.append("[N/A]" if value is None else str(value))
    print(", ".join(values))
"""


def stand_in_nvidia_smi(bin_dir: Path, gpus: list[dict[str, Any]]) -> Path:
    """Write ``bin_dir/nvidia-smi`` answering for ``gpus``; returns its state file."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    state = bin_dir / STATE_NAME
    set_gpus(state, gpus)
    script = bin_dir / "nvidia-smi"
    script.write_text(_SCRIPT.format(python=sys.executable, state=str(state)))
    script.chmod(0o755)
    return state


def set_gpus(state_file: Path, gpus: list[dict[str, Any]]) -> None:
    """What the stand-in answers from its next call on (written whole, never half)."""
    tmp = state_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(gpus))
    tmp.chmod(0o644)
    os.replace(tmp, state_file)


def gpu(
    name: str = "NVIDIA A10G",
    *,
    util: float = 0,
    mem_used_mib: int = 0,
    mem_total_mib: int = 23028,
    power_w: float | None = 60.5,
    temp_c: float | None = 41,
) -> dict[str, Any]:
    """One GPU of the stand-in's state."""
    return {
        "name": name,
        "util": util,
        "mem_used_mib": mem_used_mib,
        "mem_total_mib": mem_total_mib,
        "power_w": power_w,
        "temp_c": temp_c,
    }
