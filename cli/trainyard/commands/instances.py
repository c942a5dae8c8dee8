"""``trainyard instances``: the workspace's machines, and ending one."""

from __future__ import annotations

import click

from .. import apitypes
from ..output import duration
from . import common, options


@click.group(cls=common.Group, invoke_without_command=True)
@click.option("-a", "--all", "show_all", is_flag=True, help="Also the terminated and lost ones.")
@options.json_option("Print the API's instance objects.")
@click.pass_context
def instances(ctx: click.Context, show_all: bool, as_json: bool) -> None:
    """The workspace's machines: type, region, market, price, state, uptime, job."""
    if ctx.invoked_subcommand is not None:
        return
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


@instances.command("terminate")
@click.argument("name")
@click.option("-y", "--yes", is_flag=True, help="Do not ask for confirmation.")
def instances_terminate(name: str, yes: bool) -> None:
    """Terminate the machine NAME (workspace admins). A job running on it
    ends as one whose machine went away (retried if its workflow says so).
    A self-hosted machine is revoked instead (`trainyard runners revoke`)."""
    client = common.client()
    if not yes:
        live = [i for i in client.list_instances() if i["name"] == name]
        job = live[0].get("current_job") if live else None
        running = f"; it is running {_current_job(job)}" if job else ""
        click.confirm(f"Terminate instance {name}{running}?", abort=True, err=True)
    ended = client.terminate_instance(name)
    click.echo(f"Instance {name} is {ended['status']}: the backend is terminating it.", err=True)


def _current_job(job: apitypes.CurrentJobOut | None) -> str:
    return f"{job['run']}/{job['job_name']}" if job else "-"
