"""``trainyard guards``: the workspace's default guards, which a run gets
where its workflow has no ``stall:`` or ``utilization_policy:`` of its own
(docs/WORKFLOWS.md, "Guards"). Everyone in the workspace reads them; its
admins set them. The server checks every value as it checks a workflow's."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import click

from ..api import GuardDefaults
from . import common, options

ACTIONS = ("stop", "restart")


@click.group(cls=common.Group, invoke_without_command=True)
@options.json_option("Print the API's answer: {stall, utilization_policy}, null where there is none.")
@click.pass_context
def guards(ctx: click.Context, as_json: bool) -> None:
    """Show the workspace's default guards: a run gets them where its
    workflow sets no stall: or utilization_policy: of its own (a workflow's
    `stall: off` turns the default off). Admins change them with
    `trainyard guards set`."""
    if ctx.invoked_subcommand is not None:
        return
    api = common.client()
    _show(api.guard_defaults(), as_json=as_json)
    if not as_json:
        click.echo(
            f"Runs of {api.workspace} get these where their workflow sets no key of its own "
            "(`stall: off` in a workflow turns one off); admins change them with `trainyard guards set`.",
            err=True,
        )


@guards.command("set")
@click.option(
    "--stall",
    metavar="TIMEOUT[:ACTION]",
    help="No new log line and no new metric value for TIMEOUT (20m, 1h30m) → stop the job, "
    "or with :restart end the attempt and start the next from its last checkpoint (20m:restart).",
)
@click.option("--no-stall", is_flag=True, help="No default stall guard.")
@click.option(
    "--utilization",
    metavar="PERCENT%:WINDOW",
    help="Stop a job whose GPUs all stay below PERCENT for WINDOW (10%:30m).",
)
@click.option("--no-utilization", is_flag=True, help="No default utilization_policy.")
@options.json_option("Print the API's answer: the defaults as now set.")
def guards_set(stall: str | None, no_stall: bool, utilization: str | None, no_utilization: bool, as_json: bool) -> None:
    """Change the workspace's default guards (admins only). A guard not
    named keeps its current default. Runs submitted from now on get them;
    runs already submitted keep theirs.

    \b
    trainyard guards set --stall 20m:restart --utilization 10%:30m
    trainyard guards set --no-stall
    """
    if stall is not None and no_stall:
        raise click.UsageError("give --stall or --no-stall, not both")
    if utilization is not None and no_utilization:
        raise click.UsageError("give --utilization or --no-utilization, not both")
    if stall is None and utilization is None and not no_stall and not no_utilization:
        raise click.UsageError(
            "name a guard to change: --stall TIMEOUT[:ACTION], --utilization PERCENT%:WINDOW, "
            "--no-stall or --no-utilization"
        )
    changes: dict[str, Any] = {}
    if stall is not None or no_stall:
        changes["stall"] = _stall(stall) if stall is not None else None
    if utilization is not None or no_utilization:
        changes["utilization_policy"] = _utilization(utilization) if utilization is not None else None
    api = common.client()
    now = api.set_guard_defaults({**api.guard_defaults(), **changes})
    _show(now, as_json=as_json)
    if not as_json:
        click.echo(
            f"Default guards of {api.workspace} set: runs submitted from now on get them "
            "(runs already submitted keep theirs).",
            err=True,
        )


def _stall(text: str) -> dict[str, Any]:
    """``20m`` → {timeout: 20m}; ``20m:restart`` → with its action. The
    duration is the server's to judge, as in a workflow."""
    timeout, _, action = text.partition(":")
    if not timeout.strip():
        raise click.BadParameter("expected TIMEOUT[:ACTION] such as 20m or 20m:restart", param_hint="--stall")
    if action and action not in ACTIONS:
        raise click.BadParameter(
            f"the action is stop or restart, got {action!r} (e.g. 20m:restart)", param_hint="--stall"
        )
    return {"timeout": timeout.strip(), **({"action": action} if action else {})}


def _utilization(text: str) -> dict[str, Any]:
    """``10%:30m`` → {min_gpu_utilization: 10, time_window: 30m}."""
    percent, _, window = text.partition(":")
    number = percent.strip().removesuffix("%")
    if not number.isdigit() or not window.strip():
        raise click.BadParameter(f"expected PERCENT%:WINDOW such as 10%:30m, got {text!r}", param_hint="--utilization")
    return {"min_gpu_utilization": int(number), "time_window": window.strip()}


def _show(defaults: GuardDefaults, *, as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps(defaults, indent=2))
        return
    for line in guard_default_lines(defaults):
        click.echo(line)


def guard_default_lines(defaults: Mapping[str, Any]) -> list[str]:
    """``stall: {timeout: 20m, action: restart}: restarted from its last
    checkpoint after 20m without output``, and ``utilization_policy: none``."""
    stall, util = defaults.get("stall"), defaults.get("utilization_policy")
    lines = []
    if isinstance(stall, Mapping):
        what = "restarted from its last checkpoint" if stall.get("action") == "restart" else "stopped"
        lines.append(
            f"stall: {{timeout: {stall.get('timeout')}, action: {stall.get('action')}}}: "
            f"{what} after {stall.get('timeout')} without output"
        )
    else:
        lines.append("stall: none")
    if isinstance(util, Mapping):
        lines.append(
            f"utilization_policy: {{min_gpu_utilization: {util.get('min_gpu_utilization')}, "
            f"time_window: {util.get('time_window')}}}: stopped when every GPU stays below "
            f"{util.get('min_gpu_utilization')}% for {util.get('time_window')}"
        )
    else:
        lines.append("utilization_policy: none")
    return lines
