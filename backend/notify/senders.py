"""How one delivery reaches its target: a signed webhook POST, a Slack
incoming webhook, or an email through Django's email backend.

Every URL's host is checked before each send (``backend.core.addresses``:
public addresses only, unless ``TRAINYARD_NOTIFY_PRIVATE_NETWORKS`` allows
the network) and connected to at the address checked; a redirect is not
followed (it counts as a failure). Each call has a timeout. A failure is a
``SendError`` with what went wrong, for the delivery log.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.core.mail import send_mail

from backend.core.addresses import AddressRefused, PinnedHTTPConnection, PinnedHTTPSConnection, public_address
from backend.notify.models import Subscription
from backend.notify.signing import signature

USER_AGENT = "Trainyard-Notifications/1"
# What is read of a receiver's answer: its status is what counts.
ANSWER_READ_BYTES = 4096


class SendError(Exception):
    """The delivery did not get through. ``status_code``: the receiver's
    answer, when it answered."""

    def __init__(self, message: str, *, status_code: int | None = None) -> None:
        super().__init__(message)
        self.status_code = status_code


@dataclass(frozen=True)
class Message:
    """What one delivery sends: the event's JSON (``payload``), its id and type."""

    delivery_id: str
    event_type: str
    payload: dict[str, Any]


def target_address(url: str) -> tuple[str, str, int, str]:
    """(scheme, host, port, address) of a webhook or Slack URL whose host
    may be reached; ``SendError`` saying why not."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise SendError(f"{url} is not an http(s) URL such as https://hooks.example.com/trainyard")
    try:
        port = parts.port or (443 if parts.scheme == "https" else 80)
    except ValueError:
        raise SendError(f"{url} has no valid port") from None
    try:
        address = public_address(parts.hostname, port, allowed=settings.TRAINYARD["NOTIFY_PRIVATE_NETWORKS"])
    except AddressRefused as e:
        hint = (
            "; notifications go only to public addresses (an installation whose receivers are internal lists "
            "their network in TRAINYARD_NOTIFY_PRIVATE_NETWORKS)"
            if e.not_public
            else ""
        )
        raise SendError(f"{url}: {e}{hint}") from None
    return parts.scheme, parts.hostname, port, address


def send_webhook(*, url: str, secret: str, message: Message) -> int:
    """POST the event's JSON, signed; the receiver's status code (2xx)."""
    body = json.dumps(message.payload, separators=(",", ":"), sort_keys=True).encode()
    headers = {
        "Content-Type": "application/json",
        "Trainyard-Event": message.event_type,
        "Trainyard-Delivery": message.delivery_id,
        "Trainyard-Signature": signature(secret=secret, body=body, timestamp=int(time.time())),
    }
    return _post(url, body, headers)


def send_slack(*, url: str, message: Message) -> int:
    """POST ``{"text": …}`` to a Slack incoming webhook; its status code
    (2xx). ``&``, ``<`` and ``>`` are escaped as Slack asks, so a run's name
    or reason cannot mention ``<!channel>`` or make a link."""
    text = summary(message.payload).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
    body = json.dumps({"text": text}).encode()
    return _post(url, body, {"Content-Type": "application/json"})


def send_email(*, address: str, message: Message) -> None:
    """One email through Django's email backend (the SMTP settings of docs/CONFIGURATION.md, "Email")."""
    text = summary(message.payload)
    body = f"{text}\n\n{json.dumps(message.payload, indent=2, sort_keys=True)}\n"
    try:
        send_mail(f"[Trainyard] {text}"[:200], body, None, [address], fail_silently=False)
    except Exception as e:  # smtplib's and the socket's errors alike: the log says which
        raise SendError(f"email to {address}: {type(e).__name__}: {e}"[:500]) from None


def send_disabled_notice(*, address: str, subscription: Subscription) -> None:
    """Tell one workspace admin that ``subscription`` was disabled, and why."""
    workspace = subscription.workspace.slug
    subject = f"[Trainyard] {workspace}: the {subscription.kind} notification to {subscription.target} was disabled"
    body = (
        f"{subscription.disabled_reason}.\n\n"
        f"Workspace {workspace}, {subscription.kind} subscription {subscription.pk} to {subscription.target}.\n"
        f"Its deliveries: trainyard notify log {subscription.pk}\n"
        f"Enable it again: PATCH /api/v1/workspaces/{workspace}/notifications/{subscription.pk}/ "
        '{"enabled": true}\n'
    )
    try:
        send_mail(_one_line(subject)[:200], body, None, [address], fail_silently=False)
    except Exception as e:  # smtplib's and the socket's errors alike
        raise SendError(f"email to {address}: {type(e).__name__}: {e}"[:500]) from None


def summary(payload: dict[str, Any]) -> str:
    """One line for people: "run train-3 succeeded", "attempt 2 of job train
    (run r1) interrupted" (whitespace and newlines of names and reasons folded)."""
    return _one_line(_summary(payload))


def _one_line(text: str) -> str:
    return " ".join(text.split())


def _summary(payload: dict[str, Any]) -> str:
    kind = str(payload.get("type", ""))
    data = payload.get("data") or {}
    run = data.get("run") or {}
    name = run.get("name", "")
    workspace = payload.get("workspace", "")
    if kind.startswith("run."):
        reason = f": {run['reason']}" if run.get("reason") else ""
        return f"{workspace}: run {name} {kind.removeprefix('run.')}{reason}"
    if kind.startswith("attempt."):
        attempt = data.get("attempt") or {}
        what = kind.removeprefix("attempt.")
        return f"{workspace}: attempt {attempt.get('number')} of job {attempt.get('job')} (run {name}) {what}"
    if kind == "job.waiting_capacity":
        job = data.get("job") or {}
        waited = f"has waited {data.get('waited_minutes')} min for capacity"
        return f"{workspace}: job {job.get('name')} (run {name}) {waited}: {data.get('reason')}"
    if kind == "guard.fired":
        job = data.get("job") or {}
        return f"{workspace}: a guard stopped job {job.get('name')} (run {name}): {data.get('message')}"
    if kind in ("budget.80", "budget.100"):
        budget = data.get("budget") or {}
        whose = f"{budget['user']}'s budget" if budget.get("user") else "the workspace budget"
        where = "is reached" if kind == "budget.100" else f"passed {budget.get('warn_percent')}%"
        return (
            f"{workspace}: {whose} of ${budget.get('monthly_limit')} for {data.get('month')} {where}: "
            f"${data.get('spent')} spent ({data.get('percent')}%), ${data.get('rate_per_hour')}/h running"
        )
    if kind == "test":
        return f"{workspace}: a test notification from Trainyard"
    message = data.get("message")
    return f"{workspace}: {kind}: {message}" if message else f"{workspace}: {kind}"


def _post(url: str, body: bytes, headers: dict[str, str]) -> int:
    scheme, host, port, address = target_address(url)
    parts = urllib.parse.urlsplit(url)
    path = urllib.parse.urlunsplit(("", "", parts.path or "/", parts.query, ""))
    pinned = PinnedHTTPSConnection if scheme == "https" else PinnedHTTPConnection
    timeout = settings.TRAINYARD["NOTIFY_TIMEOUT_SECONDS"]
    connection = pinned(host, port, address=address, timeout=timeout)
    try:
        connection.request("POST", path, body=body, headers={"User-Agent": USER_AGENT, **headers})
        answer = connection.getresponse()
        answer.read(ANSWER_READ_BYTES)
    except (OSError, http.client.HTTPException) as e:
        raise SendError(f"could not reach {host}:{port} ({e})"[:500]) from None
    finally:
        connection.close()
    if not 200 <= answer.status < 300:
        raise SendError(f"the receiver answered {answer.status} {answer.reason}"[:500], status_code=answer.status)
    return answer.status
