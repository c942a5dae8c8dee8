"""Webhooks, Slack and email subscriptions, sent to real receivers the
tests start: the signature a receiver checks with the documented snippet
(docs/examples/verify_webhook.py), retries, the loopback refusal, the
delivery log, who may manage what."""

from __future__ import annotations

import email
import email.policy
import importlib.util
import json
import re
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from django.utils import timezone

from backend.accounts.models import AuditEvent, Membership, Role, User, Workspace
from backend.accounts.services.users import user_get_or_create
from backend.notify.models import Delivery, Subscription
from backend.notify.senders import summary
from backend.notify.services import (
    DISABLED_REASON_MAX,
    SUBSCRIPTIONS_MAX,
    deliveries_record,
    delivery_send,
    disabled_notice_send,
    disabled_reason,
    notify_event,
)
from tests.notify.conftest import Inbox, Receiver
from tests.support.fixtures import Person, submit
from tests.support.queue import enqueued

SNIPPET = Path(__file__).resolve().parents[2] / "docs" / "examples" / "verify_webhook.py"
NOTIFICATIONS = "/api/v1/workspaces/acme/notifications/"


def documented_check() -> ModuleType:
    spec = importlib.util.spec_from_file_location("verify_webhook", SNIPPET)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cost_doc_check() -> Any:
    """The ``verify`` of docs/COST.md's snippet ("Notifications"), as printed there."""
    text = (SNIPPET.parents[1] / "COST.md").read_text()
    code = text.split("## Notifications", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    scope: dict[str, Any] = {}
    exec(compile(code, "docs/COST.md", "exec"), scope)  # the documented snippet itself
    return scope["verify"]


def subscribe(person: Person, target: str, kind: str = "webhook", **extra: Any) -> dict[str, Any]:
    body = {"kind": kind, "target": target, "events": ["run.succeeded", "run.failed"], **extra}
    response = person.client().post(NOTIFICATIONS, body, format="json")
    assert response.status_code == 201, response.json()
    return dict(response.json())


def send_test(person: Person, subscription_id: str) -> str:
    response = person.client().post(f"{NOTIFICATIONS}{subscription_id}/test/")
    assert response.status_code == 202, response.json()
    return str(response.json()["id"])


@pytest.mark.usefixtures("private")
def test_send_test_delivers_a_body_the_documented_check_accepts(owner: Person, receiver: Receiver) -> None:
    created = subscribe(owner, receiver.url)
    delivery_id = send_test(owner, created["id"])

    assert delivery_send(delivery_id=delivery_id) == "delivered"

    (got,) = receiver.got
    assert got.headers["Trainyard-Event"] == "test"
    assert got.headers["Trainyard-Delivery"] == delivery_id
    assert documented_check().verify(created["secret"], got.body, got.headers["Trainyard-Signature"])
    cost_md = cost_doc_check()
    assert cost_md(created["secret"], got.body, got.headers["Trainyard-Signature"])
    assert not cost_md(created["secret"], got.body + b" ", got.headers["Trainyard-Signature"])
    assert json.loads(got.body)["type"] == "test"
    assert json.loads(got.body)["workspace"] == "acme"


@pytest.mark.usefixtures("private")
def test_a_replayed_or_altered_body_is_refused_by_the_documented_check(owner: Person, receiver: Receiver) -> None:
    created = subscribe(owner, receiver.url)
    delivery_send(delivery_id=send_test(owner, created["id"]))
    (got,) = receiver.got
    header = got.headers["Trainyard-Signature"]
    signed_at = int(header.split(",")[0].removeprefix("t="))
    check = documented_check()

    assert check.verify(created["secret"], got.body, header, now=signed_at + 299)
    assert not check.verify(created["secret"], got.body, header, now=signed_at + 301)  # replayed 5 min later
    assert not check.verify(created["secret"], got.body.replace(b"acme", b"acmf"), header, now=signed_at)
    assert not check.verify("whsec_another", got.body, header, now=signed_at)


@pytest.mark.usefixtures("private")
def test_a_receiver_answering_500_twice_gets_the_third_try(owner: Person, receiver: Receiver) -> None:
    receiver.answers = [500, 500]
    created = subscribe(owner, receiver.url)
    delivery_id = send_test(owner, created["id"])

    waits = []
    for _ in range(3):
        before = timezone.now()
        status = delivery_send(delivery_id=delivery_id)
        delivery = Delivery.objects.get(pk=delivery_id)
        if status == "pending":
            waits.append(round((delivery.next_at - before).total_seconds()))
            Delivery.objects.filter(pk=delivery_id).update(next_at=timezone.now())  # the retry clock, moved on

    assert status == "delivered"
    assert waits == [30, 120]  # TRAINYARD_NOTIFY_RETRY_SECONDS, then 4 times longer
    assert [g.headers["Trainyard-Delivery"] for g in receiver.got] == [delivery_id] * 3
    assert (delivery.attempts, delivery.last_status_code, delivery.last_error) == (3, 200, "")
    log = owner.client().get(f"{NOTIFICATIONS}{created['id']}/deliveries/").json()
    assert [(d["event_type"], d["status"], d["attempts"], d["last_status_code"]) for d in log] == [
        ("test", "delivered", 3, 200)
    ]


@pytest.mark.usefixtures("private")
def test_the_delivery_log_shows_a_failure_with_its_status_code(owner: Person, receiver: Receiver) -> None:
    receiver.answers = [503]
    created = subscribe(owner, receiver.url)
    delivery_send(delivery_id=send_test(owner, created["id"]))

    (row,) = owner.client().get(f"{NOTIFICATIONS}{created['id']}/deliveries/").json()
    assert (row["status"], row["attempts"], row["last_status_code"]) == ("pending", 1, 503)
    assert row["last_error"] == "the receiver answered 503 Service Unavailable"


@pytest.mark.usefixtures("private")
def test_a_delivery_failing_for_a_day_is_failed(owner: Person, receiver: Receiver) -> None:
    receiver.answers = [500]
    created = subscribe(owner, receiver.url)
    delivery_id = send_test(owner, created["id"])
    Delivery.objects.filter(pk=delivery_id).update(created_at=timezone.now() - timedelta(hours=24))

    assert delivery_send(delivery_id=delivery_id) == "failed"
    assert Delivery.objects.get(pk=delivery_id).next_at is None


@pytest.mark.usefixtures("private")
def test_a_subscription_failing_for_days_is_disabled_and_the_admins_are_told(
    team: Workspace,
    owner: Person,
    member: Person,
    receiver: Receiver,
    smtp: Inbox,
    django_capture_on_commit_callbacks: Any,
) -> None:
    User.objects.filter(pk=owner.user.pk).update(email="olivia@acme.example")
    User.objects.filter(pk=member.user.pk).update(email="mateo@acme.example")  # a member: not told
    Membership.objects.create(workspace=team, user=user_get_or_create(username="otis"), role=Role.ADMIN)  # no address
    receiver.answers = [500]
    created = subscribe(owner, receiver.url)
    Subscription.objects.filter(pk=created["id"]).update(failing_since=timezone.now() - timedelta(days=3, hours=1))

    with django_capture_on_commit_callbacks() as callbacks:
        delivery_send(delivery_id=send_test(owner, created["id"]))
    assert "backend.notify.tasks.disabled_notice_send" in enqueued(callbacks)
    assert disabled_notice_send(subscription_id=created["id"]) == 1  # what that task does

    shown = owner.client().get(f"{NOTIFICATIONS}{created['id']}/").json()
    assert not shown["enabled"]
    assert shown["disabled_reason"] == (
        "disabled: no delivery got through for 3 days; the last: the receiver answered 500 Internal Server Error; "
        "enable it again once the receiver is fixed"
    )
    audit = AuditEvent.objects.get(action="workspace.notification_disabled")
    assert audit.target == f"webhook {receiver.url}"
    (envelope,) = smtp.envelopes
    assert envelope.rcpt_tos == ["olivia@acme.example"]
    message = email.message_from_bytes(envelope.original_content or b"", policy=email.policy.default)
    assert message["Subject"] == f"[Trainyard] acme: the webhook notification to {receiver.url} was disabled"
    text = message.get_content()  # type: ignore[attr-defined]
    assert shown["disabled_reason"] in text
    assert f"trainyard notify log {created['id']}" in text


@pytest.mark.usefixtures("private")
def test_a_subscription_enabled_again_before_the_notice_is_sent_tells_no_one(
    owner: Person, receiver: Receiver, smtp: Inbox
) -> None:
    User.objects.filter(pk=owner.user.pk).update(email="olivia@acme.example")
    receiver.answers = [500]
    created = subscribe(owner, receiver.url)
    Subscription.objects.filter(pk=created["id"]).update(failing_since=timezone.now() - timedelta(days=4))
    delivery_send(delivery_id=send_test(owner, created["id"]))
    assert owner.client().patch(f"{NOTIFICATIONS}{created['id']}/", {"enabled": True}, format="json").status_code == 200

    assert disabled_notice_send(subscription_id=created["id"]) == 0
    assert smtp.envelopes == []


@pytest.mark.usefixtures("private")
def test_a_delivery_that_gets_through_ends_the_failing(owner: Person, receiver: Receiver) -> None:
    created = subscribe(owner, receiver.url)
    Subscription.objects.filter(pk=created["id"]).update(failing_since=timezone.now() - timedelta(days=1))

    delivery_send(delivery_id=send_test(owner, created["id"]))

    assert Subscription.objects.get(pk=created["id"]).failing_since is None


def test_a_webhook_to_loopback_is_refused_when_private_networks_are_not_allowed(
    owner: Person, receiver: Receiver, settings: Any
) -> None:
    assert settings.TRAINYARD["NOTIFY_PRIVATE_NETWORKS"] == []  # the installation's default (hosted)
    response = owner.client().post(
        NOTIFICATIONS, {"kind": "webhook", "target": receiver.url, "events": ["run.failed"]}, format="json"
    )

    assert response.status_code == 400
    message = response.json()["message"]
    assert "its host resolves to 127.0.0.1, a loopback address" in message
    assert "TRAINYARD_NOTIFY_PRIVATE_NETWORKS" in message
    assert not Subscription.objects.exists()


def test_a_send_to_a_host_that_became_loopback_is_refused_before_connecting(
    owner: Person, receiver: Receiver, settings: Any
) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "NOTIFY_PRIVATE_NETWORKS": ["127.0.0.0/8"]}
    created = subscribe(owner, receiver.url)
    settings.TRAINYARD = {**settings.TRAINYARD, "NOTIFY_PRIVATE_NETWORKS": []}

    delivery_send(delivery_id=send_test(owner, created["id"]))

    assert receiver.got == []
    (row,) = owner.client().get(f"{NOTIFICATIONS}{created['id']}/deliveries/").json()
    assert "a loopback address" in row["last_error"]


@pytest.mark.usefixtures("private")
def test_the_secret_is_shown_at_creation_and_never_again(owner: Person, receiver: Receiver) -> None:
    created = subscribe(owner, receiver.url)

    assert created["secret"].startswith("whsec_") and len(created["secret"]) > 40
    listed = owner.client().get(NOTIFICATIONS).json()
    shown = owner.client().get(f"{NOTIFICATIONS}{created['id']}/").json()
    assert [s["id"] for s in listed] == [created["id"]]
    assert "secret" not in listed[0] and "secret" not in shown
    assert created["secret"].encode() not in bytes(Subscription.objects.get().secret_ciphertext)


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"kind": "webhook", "target": "ftp://example.com/x", "events": ["run.failed"]}, "is not an http(s) URL"),
        ({"kind": "email", "target": "not-an-address", "events": ["run.failed"]}, "is not an email address"),
        ({"kind": "webhook", "target": "https://example.com/x", "events": ["run.exploded"]}, "run.exploded"),
    ],
)
def test_bad_subscriptions_are_refused_with_what_to_change(owner: Person, body: dict[str, Any], message: str) -> None:
    response = owner.client().post(NOTIFICATIONS, body, format="json")

    assert response.status_code == 400
    assert message in json.dumps(response.json())
    assert not Subscription.objects.exists()


@pytest.mark.usefixtures("private")
def test_a_member_subscribes_only_for_their_own_runs(
    team: Workspace, owner: Person, member: Person, receiver: Receiver
) -> None:
    refused = member.client().post(
        NOTIFICATIONS,
        {"kind": "webhook", "target": receiver.url, "events": ["run.succeeded"], "scope": "workspace"},
        format="json",
    )
    assert refused.status_code == 403
    mine = subscribe(member, receiver.url)
    workspace_wide = subscribe(owner, receiver.url)
    assert mine["scope"] == "mine" and workspace_wide["scope"] == "workspace"

    owners_run, members_run = submit(team, owner.user), submit(team, member.user)
    heard = {
        name: {d.subscription_id for d in deliveries_record(workspace_id=str(team.pk), type="run.succeeded", data=data)}
        for name, data in (("owner's", _run(owners_run)), ("member's", _run(members_run)))
    }

    assert {str(s) for s in heard["owner's"]} == {workspace_wide["id"]}
    assert {str(s) for s in heard["member's"]} == {workspace_wide["id"], mine["id"]}
    assert [s["id"] for s in member.client().get(NOTIFICATIONS).json()] == [mine["id"]]
    assert {s["id"] for s in owner.client().get(NOTIFICATIONS).json()} == {mine["id"], workspace_wide["id"]}
    assert member.client().get(f"{NOTIFICATIONS}{workspace_wide['id']}/").status_code == 404
    assert member.client().delete(f"{NOTIFICATIONS}{workspace_wide['id']}/").status_code == 404
    assert owner.client().patch(f"{NOTIFICATIONS}{mine['id']}/", {"enabled": False}, format="json").status_code == 200


def test_slack_gets_one_line_of_text(owner: Person, receiver: Receiver, settings: Any) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "NOTIFY_PRIVATE_NETWORKS": ["127.0.0.0/8"]}
    created = subscribe(owner, receiver.url, kind="slack")

    delivery_send(delivery_id=send_test(owner, created["id"]))

    (got,) = receiver.got
    assert json.loads(got.body) == {"text": "acme: a test notification from Trainyard"}
    assert created["secret"] == ""


@pytest.mark.usefixtures("private")
def test_slack_text_cannot_mention_the_channel(team: Workspace, owner: Person, receiver: Receiver) -> None:
    subscribe(owner, receiver.url, kind="slack")
    run = submit(team, owner.user)
    data = {"run": {"id": str(run.pk), "name": run.name, "status": "failed", "reason": "<!channel> & <https://x|y>"}}
    (delivery,) = deliveries_record(workspace_id=str(team.pk), type="run.failed", data=data)

    delivery_send(delivery_id=str(delivery.pk))

    text = json.loads(receiver.got[0].body)["text"]
    assert text == f"acme: run {run.name} failed: &lt;!channel&gt; &amp; &lt;https://x|y&gt;"


@pytest.mark.usefixtures("private")
def test_a_member_who_left_hears_no_more_of_their_runs(
    team: Workspace, owner: Person, member: Person, receiver: Receiver
) -> None:
    subscribe(member, receiver.url)
    run = submit(team, member.user)
    assert deliveries_record(workspace_id=str(team.pk), type="run.succeeded", data=_run(run))

    Membership.objects.filter(workspace=team, user=member.user).delete()

    assert deliveries_record(workspace_id=str(team.pk), type="run.succeeded", data=_run(run)) == []


def test_a_workspace_has_at_most_so_many_subscriptions(team: Workspace, owner: Person) -> None:
    Subscription.objects.bulk_create(
        Subscription(workspace=team, kind="slack", target=f"https://1.1.1.1/{n}", events=["run.failed"])
        for n in range(SUBSCRIPTIONS_MAX)
    )

    response = owner.client().post(
        NOTIFICATIONS, {"kind": "slack", "target": "https://1.1.1.1/more", "events": ["run.failed"]}, format="json"
    )

    assert response.status_code == 409
    assert response.json()["message"].startswith(f"acme has {SUBSCRIPTIONS_MAX} notification subscriptions")
    assert Subscription.objects.count() == SUBSCRIPTIONS_MAX


def test_an_event_no_subscription_may_choose_is_refused_where_it_is_emitted(team: Workspace) -> None:
    with pytest.raises(ValueError, match=re.escape("unknown event 'run.exploded'")):
        notify_event(workspace_id=team.pk, type="run.exploded", data={})


def test_a_disabled_reason_with_a_long_error_fits_its_field_and_still_says_what_to_do() -> None:
    reason = disabled_reason(3, "could not reach hooks.example.com:443 (" + "x" * 480 + ")")

    assert len(reason) == DISABLED_REASON_MAX
    assert reason.startswith("disabled: no delivery got through for 3 days; the last: could not reach hooks.example")
    assert reason.endswith("x…; enable it again once the receiver is fixed")


def test_a_reason_over_several_lines_is_one_line_in_a_summary() -> None:
    payload = {"type": "run.failed", "workspace": "acme", "data": {"run": {"name": "r1", "reason": "boom\r\nTo: x"}}}

    assert summary(payload) == "acme: run r1 failed: boom To: x"


def _run(run: Any) -> dict[str, Any]:
    return {"run": {"id": str(run.pk), "name": run.name, "status": "succeeded", "reason": ""}}


def test_a_budget_event_says_whose_budget_how_far_and_at_what_rate() -> None:
    data = {
        "budget": {"user": None, "monthly_limit": "500.00", "warn_percent": 80},
        "month": "2026-12",
        "spent": "412.0000",
        "rate_per_hour": "3.0600",
        "percent": 82.4,
        "level": 80,
    }
    warned = summary({"type": "budget.80", "workspace": "acme", "data": data})
    assert warned == (
        "acme: the workspace budget of $500.00 for 2026-12 passed 80%: $412.0000 spent (82.4%), $3.0600/h running"
    )
    mine = {**data, "budget": {**data["budget"], "user": "alice"}}
    reached = summary({"type": "budget.100", "workspace": "acme", "data": mine})
    assert reached.startswith("acme: alice's budget of $500.00 for 2026-12 is reached: $412.0000 spent")
