"""GPU names: the one rule that says whether a GPU is the one a job asked for.

Three kinds of names meet here: what a workflow or ``trainyard offers
--gpu`` writes (``L4``, ``a100``, ``A100-80GB``), what a catalog lists
(gpuhunt's ``A100`` with its memory beside it) and what ``nvidia-smi``
reports on a machine (``NVIDIA L40S``, ``NVIDIA A100-SXM4-40GB``, ``Tesla
T4``). Each is reduced to a *model* by ``gpu_model``:

- case is ignored; spaces, hyphens and underscores are one separator;
- a leading vendor or brand word goes (``NVIDIA``, ``Tesla``, ``GeForce``,
  ``Quadro``), and so does a form factor (``SXM4``, ``PCIe``, ``HBM3``);
- a memory size in the name (``40GB``) is kept, written last
  (``A100-SXM4-40GB`` and ``A100 40GB PCIe`` are both ``A100-40GB``);
- a family the models table below declares (``A100``), named without a
  memory size but with the GPU's memory known, is the family's model of that
  memory (a catalog's ``A100`` of 40 GiB is ``A100-40GB``).

A request matches a GPU when the two models are equal, or when the request
names an alias the models table declares for the GPU's model (``A100``
matches ``A100-40GB`` and ``A100-80GB``). There is no other fuzziness:
``L4`` is not ``L40S`` and ``A10`` is neither ``A100`` nor ``A10G``.

The models table is ``aws/catalog/gpu_models.csv``, next to the catalog
whose names it qualifies (docs/BACKENDS.md, docs/WORKFLOWS.md): one row per
model (``model, alias, memory_gib``).
"""

from __future__ import annotations

import csv
import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

MODELS_FILE = Path(__file__).with_name("aws") / "catalog" / "gpu_models.csv"

_VENDOR_WORDS = frozenset({"NVIDIA", "TESLA", "GEFORCE", "QUADRO"})
_FORM_FACTOR = re.compile(r"^(SXM\d*|PCIE|HBM\d*E?)$")
_MEMORY = re.compile(r"^(\d+)GB$")
_SEPARATORS = re.compile(r"[\s_-]+")
# A reported memory size is this close to the declared one (nvidia-smi gives
# 16160 MiB for a 16 GB V100 and 81559 MiB for an 80 GB H100).
_MEMORY_TOLERANCE = 0.1
_GIB = 2**30


@dataclass(frozen=True)
class GpuModel:
    """A row of the models table: ``model`` also answers to ``alias``."""

    model: str
    alias: str
    memory_gib: int


def gpu_model(name: str, memory_bytes: int = 0) -> str:
    """The model a GPU name stands for (module docstring); "" for no name."""
    words = [w for w in _SEPARATORS.split(name.strip().upper()) if w]
    while len(words) > 1 and words[0] in _VENDOR_WORDS:
        words = words[1:]
    memory = [w for w in words if _MEMORY.match(w)]
    base = [w for w in words if not _MEMORY.match(w) and not _FORM_FACTOR.match(w)] or words
    model = "-".join(base + memory[-1:])
    if not memory and memory_bytes > 0:
        return _variant(model, memory_bytes) or model
    return model


def gpu_matches(requested: str, name: str, memory_bytes: int = 0) -> bool:
    """True when the GPU called ``name`` (of ``memory_bytes``, 0 if unknown)
    is the one ``requested`` names: the same model, or a model the table
    gives ``requested`` as its alias. An empty request matches any GPU."""
    wanted = gpu_model(requested)
    if not wanted:
        return True
    model = gpu_model(name, memory_bytes)
    if model == wanted:
        return True
    row = models().get(model)
    return row is not None and row.alias == wanted


def models() -> Mapping[str, GpuModel]:
    """The models table, by model."""
    return _models(str(MODELS_FILE))


def aliases() -> Mapping[str, tuple[str, ...]]:
    """Each declared alias and the models it stands for."""
    out: dict[str, tuple[str, ...]] = {}
    for row in models().values():
        out[row.alias] = (*out.get(row.alias, ()), row.model)
    return out


def _variant(family: str, memory_bytes: int) -> str | None:
    """The family's model whose declared memory is ``memory_bytes``, if one is."""
    gib = memory_bytes / _GIB
    for row in models().values():
        if row.alias == family and abs(gib - row.memory_gib) <= row.memory_gib * _MEMORY_TOLERANCE:
            return row.model
    return None


@functools.cache
def _models(path: str) -> Mapping[str, GpuModel]:
    with open(path, newline="") as file:
        rows = [
            GpuModel(gpu_model(r["model"]), gpu_model(r["alias"]), int(r["memory_gib"])) for r in csv.DictReader(file)
        ]
    return {row.model: row for row in rows}
