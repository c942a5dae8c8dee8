"""The shipped EC2 catalog: instance types, resources and list prices per region.

``catalog/aws.csv`` has the column layout of the ``gpuhunt`` library's
offline catalogs (v2: ``instance_name, location, price, cpu, memory,
gpu_count, gpu_name, gpu_memory, spot, disk_size, gpu_vendor, flags,
cpu_arch, provider_data``), so one of its published ``aws.csv`` files can be
dropped in (config key ``catalog_file``). ``memory``, ``gpu_memory`` and
``disk_size`` are GB (GiB as AWS counts them); ``location`` is a region;
``spot`` rows hold an estimate (the account's own spot prices replace it when
they are sane, ``facts.py``); ``flags`` are space-separated
(``previous-generation`` marks p3). A GPU's name becomes its exact model
(``gpus.gpu_model``): gpuhunt's ``A100`` of 40 GB is ``A100-40GB``, as
``gpu_models.csv`` beside it declares (``A100`` stays its alias). ``catalog/version`` holds the date the
prices were taken (``CATALOG_DATE``): they are approximations of public list
prices, to be refreshed (docs/decisions/0021-aws-catalog.md).
"""

from __future__ import annotations

import csv
import functools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from backend.clouds.backends.base import Gpu
from backend.clouds.backends.errors import InvalidConfig
from backend.clouds.backends.gpus import gpu_model

GIB = 2**30
CATALOG_DIR = Path(__file__).with_name("catalog")
CATALOG_FILE = CATALOG_DIR / "aws.csv"
CATALOG_DATE = (CATALOG_DIR / "version").read_text().strip()  # yyyymmdd, gpuhunt's version format
# EBS gp3 storage, USD per GiB-month (us-east-1's list price, prorated per second).
GP3_GIB_MONTH = "0.08"
COLUMNS = ("instance_name", "location", "price", "cpu", "memory", "gpu_count", "gpu_name", "gpu_memory", "spot")


@dataclass(frozen=True)
class CatalogRow:
    """One row: a type in a region, one market. ``disk_gib`` 0: EBS, sized per request."""

    instance_type: str
    region: str
    spot: bool
    price_per_hour: float
    cpus: int
    memory_bytes: int
    gpus: tuple[Gpu, ...]
    disk_gib: int = 0
    flags: tuple[str, ...] = ()

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)


def load_catalog(path: Path | None = None) -> tuple[CatalogRow, ...]:
    """The rows of ``path`` (default: the shipped catalog); ``InvalidConfig``
    naming the file and line of a row that does not parse."""
    return _load(str(path or CATALOG_FILE))


def by_key(rows: Sequence[CatalogRow]) -> Mapping[tuple[str, str, bool], CatalogRow]:
    """Rows by (region, instance type, spot)."""
    return {(row.region, row.instance_type, row.spot): row for row in rows}


@functools.cache
def _load(path: str) -> tuple[CatalogRow, ...]:
    try:
        with open(path, newline="") as file:
            reader = csv.DictReader(file)
            missing = [column for column in COLUMNS if column not in (reader.fieldnames or ())]
            if missing:
                raise InvalidConfig(
                    f"the aws catalog {path} lacks the columns {', '.join(missing)} (gpuhunt's layout)",
                    code="BadCatalog",
                )
            return tuple(_row(path, number, row) for number, row in enumerate(reader, start=2))
    except OSError as exc:
        raise InvalidConfig(f"the aws catalog {path} cannot be read: {exc.strerror}", code="BadCatalog") from exc


def _row(path: str, number: int, row: Mapping[str, str]) -> CatalogRow:
    try:
        gpu_count = int(row["gpu_count"] or 0)
        memory = round(float(row["gpu_memory"] or 0) * GIB)
        # gpuhunt's name qualified by its memory where the models table says so: A100 of 40 GB is A100-40GB.
        gpu = Gpu(name=gpu_model(row["gpu_name"], memory), memory_bytes=memory)
        return CatalogRow(
            instance_type=_required(row, "instance_name"),
            region=_required(row, "location"),
            spot=row["spot"].strip().lower() == "true",
            price_per_hour=float(row["price"]),
            cpus=int(row["cpu"]),
            memory_bytes=round(float(row["memory"]) * GIB),
            gpus=(gpu,) * gpu_count,
            disk_gib=round(float(row.get("disk_size") or 0)),
            flags=tuple((row.get("flags") or "").split()),
        )
    except (KeyError, ValueError) as exc:
        raise InvalidConfig(f"the aws catalog {path}, line {number}: {exc}", code="BadCatalog") from exc


def _required(row: Mapping[str, str], column: str) -> str:
    value = row[column].strip()
    if not value:
        raise ValueError(f"column {column!r} is empty")
    return value
