"""``trainyard instances``: the workspace's machines."""

from __future__ import annotations

import click

from .. import apitypes
from ..output import duration
from . import common, options


@click.command()
@click.option("-a", "--all", "show_all", is_flag=True, help="Also the terminated and lost ones.")
@options.json_option("Print the API's instance objects.")
def instances(show_all: bool, as_json: bool) -> None:
    """The workspace's machines: type, region, market, price, state, uptime, job."""
    common.print_list(
        common.client().list_instances(all_=show_all),
        lambda i: [
            i["name"],
            i.get("backend") or "-",
            i.get("instance_type") or "-",
            i.get("region") or "-",
            "spot" if i.get("spot") else "on-demand",
            f"${float(i.get('price_per_hour') or 0):.4f}",
            i["status"],
            i.get("cloud_state") or "-",
            duration(i.get("uptime_seconds")),
            _current_job(i.get("current_job")),
        ],
        as_json=as_json,
        headers=["NAME", "BACKEND", "TYPE", "REGION", "MARKET", "PRICE/H", "STATUS", "CLOUD", "UPTIME", "JOB"],
        empty="No instances running.",
    )


def _current_job(job: apitypes.CurrentJobOut | None) -> str:
    return f"{job['run']}/{job['job_name']}" if job else "-"
