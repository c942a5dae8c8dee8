"""``trainyard notify``: the workspace's notification subscriptions (signed
webhooks, Slack, email). A webhook's signing secret is printed once, when
the subscription is made."""

from __future__ import annotations

import click

from ..api import Delivery, Subscription
from ..output import age
from . import common, options

EVENTS = (
    "run.succeeded",
    "run.failed",
    "run.stopped",
    "attempt.interrupted",
    "attempt.resumed",
    "job.waiting_capacity",
    "guard.fired",
    "budget.80",
    "budget.100",
)
DEFAULT_EVENTS = ("run.succeeded", "run.failed", "run.stopped")


@click.group(cls=common.Group)
def notify() -> None:
    """Notifications of the workspace's runs: signed webhooks, Slack incoming
    webhooks, email. Admins subscribe for the workspace; a member for the
    runs they submit (--mine)."""


@notify.command("add")
@click.argument("kind", type=click.Choice(["webhook", "slack", "email"]))
@click.argument("target")
@click.option(
    "--event",
    "events",
    multiple=True,
    type=click.Choice(EVENTS),
    help=f"An event to send (repeatable; default: {', '.join(DEFAULT_EVENTS)}).",
)
@click.option("--mine", is_flag=True, help="Only the runs I submit (what a member's subscription always is).")
@options.json_option("Print the API's subscription object (with a webhook's secret).")
def notify_add(kind: str, target: str, events: tuple[str, ...], mine: bool, as_json: bool) -> None:
    """Subscribe TARGET (a URL, or an email address) to the workspace's run events."""
    body = {"kind": kind, "target": target, "events": list(events or DEFAULT_EVENTS)}
    if mine:
        body["scope"] = "mine"
    created = common.client().create_notification(body)
    if as_json:
        common.print_json(created)
        return
    click.echo(f"{created['id']}  {kind} {created['target']}  ({', '.join(created['events'])})")
    if created.get("secret"):
        click.echo(f"Signing secret (shown once; store it where the receiver reads it): {created['secret']}")


@notify.command("ls")
@options.json_option("Print the API's subscription objects.")
def notify_ls(as_json: bool) -> None:
    """List the subscriptions I may manage (an admin: all of the workspace's)."""
    common.print_list(
        common.client().list_notifications(),
        _row,
        as_json=as_json,
        headers=["ID", "KIND", "SCOPE", "TARGET", "EVENTS", "STATE", "BY"],
        empty="No notifications yet: add one with `trainyard notify add webhook https://…`.",
    )


@notify.command("rm")
@click.argument("subscription_id")
def notify_rm(subscription_id: str) -> None:
    """Remove a subscription (its delivery log goes with it)."""
    common.client().remove_notification(subscription_id)
    click.echo(f"Removed notification {subscription_id}", err=True)


@notify.command("test")
@click.argument("subscription_id")
def notify_test(subscription_id: str) -> None:
    """Send a `test` event to the subscription; see how it went with `trainyard notify log`."""
    delivery = common.client().test_notification(subscription_id)
    click.echo(f"Test event queued (delivery {delivery['id']}): trainyard notify log {subscription_id}", err=True)


@notify.command("log")
@click.argument("subscription_id")
@options.json_option("Print the API's delivery objects.")
def notify_log(subscription_id: str, as_json: bool) -> None:
    """The subscription's newest deliveries: status, tries, the receiver's answer."""
    common.print_list(
        common.client().notification_deliveries(subscription_id),
        _delivery_row,
        as_json=as_json,
        headers=["EVENT", "STATUS", "TRIES", "CODE", "WHEN", "ERROR"],
        empty="No deliveries yet.",
    )


def _row(s: Subscription) -> list[str]:
    state = "enabled" if s["enabled"] else f"disabled {s.get('disabled_reason') or ''}".strip()
    if s["enabled"] and s.get("failing_since"):
        state = f"failing since {age(s['failing_since'])}"
    return [s["id"], s["kind"], s["scope"], s["target"], ",".join(s["events"]), state, s.get("created_by") or ""]


def _delivery_row(d: Delivery) -> list[str]:
    code = "" if d.get("last_status_code") is None else str(d["last_status_code"])
    return [d["event_type"], d["status"], str(d["attempts"]), code, age(d["created_at"]), d.get("last_error") or ""]
