"""``trainyard offers``: the machines the workspace's backends offer for a
job's needs, cheapest first (the offers a run with the same ``--backend``
and ``--region`` chooses from)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

import click

from .. import apitypes
from ..output import print_table, size
from . import common, options


@click.command()
@click.option(
    "--gpu",
    default="",
    help="A GPU model, with an optional count: L4 or A100:2 (exact; A100 is A100-40GB or A100-80GB).",
)
@click.option("--memory", default="", help="At least this much memory, e.g. 16GB.")
@click.option("--cpu", default="", help="At least this many CPUs.")
@click.option("--spot/--on-demand", "spot", default=None, help="Only spot, or only on-demand offers (default both).")
@options.region_option(overrides=False)
@options.backend_option(overrides=False)
@click.option("-n", "limit", type=click.IntRange(min=1), default=20, show_default=True, help="At most N offers.")
@options.json_option("Print the API's answer.")
def offers(
    gpu: str,
    memory: str,
    cpu: str,
    spot: bool | None,
    regions: list[str],
    backends: list[str],
    limit: int,
    as_json: bool,
) -> None:
    """Machines the workspace's backends offer for these needs, cheapest first."""
    policy = "auto" if spot is None else ("spot" if spot else "on-demand")
    found = common.client().offers(
        gpu=gpu, memory=memory, cpu=cpu, spot_policy=policy, region=",".join(regions), backend=",".join(backends)
    )
    if as_json:
        common.print_json(found)
        return
    if not found["offers"]:
        why = f": {found['shortfall']}" if found.get("shortfall") else ""
        click.echo(f"No offer fits (from {found['accounts']} backend(s)){why}", err=True)
        return
    rows = [
        [
            o["region"],
            o.get("zone") or "-",
            o["instance_type"],
            "spot" if o["spot"] else "on-demand",
            f"${o['price_per_hour']:.4f}",
            str(o["cpus"]),
            size(o["memory_bytes"]),
            _gpus(o.get("gpus") or []),
        ]
        for o in found["offers"][:limit]
    ]
    print_table(
        ["REGION", "ZONE", "TYPE", "MARKET", "PRICE/H", "CPUS", "MEMORY", "GPUS"], rows, tty=sys.stdout.isatty()
    )
    dates = sorted({date for o in found["offers"] if (date := o.get("catalog_date"))})
    if dates:
        click.echo(f"Prices from the catalog of {', '.join(dates)}", err=True)


def _gpus(gpus: Sequence[apitypes.GpuOut]) -> str:
    if not gpus:
        return "-"
    names: dict[str, int] = {}
    for gpu in gpus:
        names[gpu["name"]] = names.get(gpu["name"], 0) + 1
    return ", ".join(f"{n}× {name}" for name, n in names.items())
