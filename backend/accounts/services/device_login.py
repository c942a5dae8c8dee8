"""Browser sign-in for the CLI: the device authorization grant (RFC 8628).

``trainyard login`` starts a request and gets a long device code (kept by
the CLI; only its sha256 is stored) and a short user code (shown to the
person). The person, signed in on the dashboard, enters the user code and
approves or denies. Meanwhile the CLI polls with the device code and is told
``authorization_pending`` (wait), ``slow_down`` (it polled sooner than
``interval``: wait 5 s longer from now on), ``access_denied``,
``expired_token`` or ``invalid_grant`` (unknown, or its token was handed out
already); once approved, its next poll gets a new API token of the person,
named for the device and of limited life (``TRAINYARD_DEVICE_LOGIN_TOKEN_DAYS``).

Bounded: a request lives ``TRAINYARD_DEVICE_LOGIN_CODE_SECONDS``; starting
and looking up codes count under the ``device`` rate limit; a user code is 8
letters of 20 consonants (20^8 ≈ 2.6·10^10, no vowels, so no words), so
guessing one within its life under that limit is hopeless. Requests that
ended a day ago are deleted when a new one starts.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from backend.accounts.models import DeviceLogin, DeviceLoginState, User
from backend.accounts.services.tokens import IssuedToken, api_token_issue
from backend.core.tokens import hash_token

DEVICE_CODE_PREFIX = "tydev_"
USER_CODE_ALPHABET = "BCDFGHJKLMNPQRSTVWXZ"
USER_CODE_LENGTH = 8
INTERVAL_SECONDS = 5
SLOW_DOWN_SECONDS = 5
KEPT_AFTER_EXPIRY = timedelta(days=1)


class DeviceGrantError(Exception):
    """What a poll is answered instead of a token: ``error`` is RFC 8628's code."""

    def __init__(self, error: str, message: str, *, interval: int | None = None) -> None:
        super().__init__(message)
        self.error = error
        self.message = message
        self.interval = interval


@dataclass(frozen=True)
class StartedDeviceLogin:
    row: DeviceLogin
    device_code: str  # in clear: only the CLI holds it

    @property
    def user_code(self) -> str:
        return display_user_code(self.row.user_code)


def display_user_code(code: str) -> str:
    """``BCDFGHJK`` as it is shown and typed: ``BCDF-GHJK``."""
    return f"{code[:4]}-{code[4:]}"


def normalize_user_code(text: str) -> str | None:
    """A typed code as stored: upper-cased, without dashes or spaces; None
    when it cannot be one (wrong length or letters)."""
    code = "".join(ch for ch in text.upper() if ch not in "- ")
    if len(code) != USER_CODE_LENGTH or any(ch not in USER_CODE_ALPHABET for ch in code):
        return None
    return code


def code_lifetime() -> timedelta:
    return timedelta(seconds=max(60, settings.TRAINYARD["DEVICE_LOGIN_CODE_SECONDS"]))


def token_lifetime() -> timedelta:
    return max(timedelta(days=settings.TRAINYARD["DEVICE_LOGIN_TOKEN_DAYS"]), timedelta(minutes=1))


def device_login_start(*, client_name: str, address: str) -> StartedDeviceLogin:
    """A new pending request for the device ``client_name``."""
    now = timezone.now()
    DeviceLogin.objects.filter(expires_at__lt=now - KEPT_AFTER_EXPIRY).delete()
    device_code = DEVICE_CODE_PREFIX + secrets.token_urlsafe(32)
    for _ in range(5):  # a user code still pending elsewhere: draw again
        user_code = "".join(secrets.choice(USER_CODE_ALPHABET) for _ in range(USER_CODE_LENGTH))
        try:
            with transaction.atomic():
                row = DeviceLogin.objects.create(
                    device_code_hash=hash_token(device_code),
                    user_code=user_code,
                    client_name=client_name,
                    address=address or None,
                    expires_at=now + code_lifetime(),
                    interval=INTERVAL_SECONDS,
                )
            return StartedDeviceLogin(row=row, device_code=device_code)
        except IntegrityError:
            continue
    raise RuntimeError("no free user code after 5 draws")  # 20^8 codes: never in practice


def pending_device_login(*, user_code: str) -> DeviceLogin | None:
    """The pending, unexpired request of a typed ``user_code``."""
    code = normalize_user_code(user_code)
    if code is None:
        return None
    return DeviceLogin.objects.filter(
        user_code=code, state=DeviceLoginState.PENDING, expires_at__gt=timezone.now()
    ).first()


def device_login_decide(*, user_code: str, user: User, approve: bool) -> DeviceLogin | None:
    """``user`` approves (or denies) the pending request of ``user_code``;
    None when there is none (unknown, expired or decided already)."""
    code = normalize_user_code(user_code)
    if code is None:
        return None
    with transaction.atomic():
        row = (
            DeviceLogin.objects.select_for_update()
            .filter(user_code=code, state=DeviceLoginState.PENDING, expires_at__gt=timezone.now())
            .first()
        )
        if row is None:
            return None
        row.state = DeviceLoginState.APPROVED if approve else DeviceLoginState.DENIED
        row.user = user
        row.decided_at = timezone.now()
        row.save(update_fields=["state", "user", "decided_at", "updated_at"])
    return row


def device_login_poll(*, device_code: str) -> IssuedToken:
    """The device's poll: the token once its request is approved (handed out
    once), else ``DeviceGrantError``. What the poll changes (its time, a
    longer interval) is kept whatever it is answered."""
    with transaction.atomic():
        row = (
            DeviceLogin.objects.select_for_update(of=("self",))
            .select_related("user")
            .filter(device_code_hash=hash_token(device_code))
            .first()
        )
        if row is None:
            raise DeviceGrantError("invalid_grant", "This device code is unknown: run `trainyard login` again.")
        outcome = _poll(row, timezone.now())
    if isinstance(outcome, DeviceGrantError):
        raise outcome
    return outcome


def _poll(row: DeviceLogin, now: datetime) -> IssuedToken | DeviceGrantError:
    if row.state == DeviceLoginState.ISSUED:
        return DeviceGrantError("invalid_grant", "This device code was used already: run `trainyard login` again.")
    if row.state == DeviceLoginState.DENIED:
        return DeviceGrantError("access_denied", "The sign-in was denied on the dashboard.")
    if row.expires_at <= now:
        return DeviceGrantError(
            "expired_token",
            f"The code {display_user_code(row.user_code)} expired before it was approved: run `trainyard login` again.",
        )
    if row.state == DeviceLoginState.PENDING:
        too_soon = row.polled_at is not None and now - row.polled_at < timedelta(seconds=row.interval)
        row.polled_at = now
        if too_soon:
            row.interval += SLOW_DOWN_SECONDS
        row.save(update_fields=["polled_at", "interval", "updated_at"])
        if too_soon:
            return DeviceGrantError(
                "slow_down", f"Polled too often: wait {row.interval} s between polls.", interval=row.interval
            )
        return DeviceGrantError(
            "authorization_pending", "Waiting for the code to be approved on the dashboard.", interval=row.interval
        )
    user = row.user
    if user is None or not user.is_active:
        return DeviceGrantError("access_denied", "The account that approved this sign-in is no longer active.")
    issued = api_token_issue(user=user, name=row.client_name, expires_in=token_lifetime())
    row.state = DeviceLoginState.ISSUED
    row.token = issued.row
    row.polled_at = now
    row.save(update_fields=["state", "token", "polled_at", "updated_at"])
    return issued
