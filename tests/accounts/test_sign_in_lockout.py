"""Sign-in lockouts: 5 wrong passwords for a username, or from an address,
within 15 minutes lock it out of password sign-in for 15 minutes (429 with
the time to wait, the right password too); admins see lockouts, and lift
them, in the Django admin. Time is the lockout's own settable clock."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from django.core.management import call_command
from django.test import Client
from rest_framework.test import APIClient

from backend.accounts.models import SignInLockout, User
from backend.accounts.services import lockout
from backend.accounts.services.lockout import SignInLocked, sign_in_attempt, sign_in_failed
from backend.accounts.services.users import user_get_or_create

pytestmark = pytest.mark.django_db

PASSWORD = "right-horse-battery"
MINUTE = 60.0


class Clock:
    """The lockout's clock, moved by hand."""

    def __init__(self, start: float) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Iterator[Clock]:
    import time

    fake = Clock(time.time())
    monkeypatch.setattr(lockout, "clock", fake)
    yield fake


@pytest.fixture(autouse=True)
def fresh_counters(settings: Any) -> None:
    """This test's own failure logs (and rate-limit counters), at the default lockout settings."""
    settings.TRAINYARD = {
        **settings.TRAINYARD,
        "RATE_LIMIT_PREFIX": f"test-{secrets.token_hex(4)}:ratelimit",
        "LOGIN_LOCKOUT_USER": (5, 900),
        "LOGIN_LOCKOUT_IP": (5, 900),
        "LOGIN_LOCKOUT_SECONDS": 900,
    }
    settings.TRAINYARD_LOCAL_LOGIN = True


@pytest.fixture
def admin() -> User:
    user = user_get_or_create(username="admin")
    user.is_staff = user.is_superuser = True
    user.set_password(PASSWORD)
    user.save()
    return user


def _login(username: str, password: str, address: str = "10.7.0.1") -> Any:
    client = APIClient(REMOTE_ADDR=address)
    return client.post("/api/v1/auth/login/", {"username": username, "password": password}, format="json")


def _assert_locked(response: Any, *, per: str, wait: int) -> None:
    assert response.status_code == 429, response.content
    assert response["Retry-After"] == str(wait)
    body = response.json()
    who = "this account" if per == "user" else "this address"
    assert body["message"].startswith(f"Too many wrong passwords for {who} (5 within 15 minutes)")
    assert body["message"].endswith(f"Try again in {wait} s.")
    extra = body["extra"]
    assert {k: extra[k] for k in ("scope", "per", "limit", "period_seconds", "retry_after_seconds")} == {
        "scope": "lockout",
        "per": per,
        "limit": 5,
        "period_seconds": 900,
        "retry_after_seconds": wait,
    }
    assert "locked_until" in extra


def test_a_sixth_wrong_password_within_15_minutes_is_429_with_the_time_to_wait(admin: User, clock: Clock) -> None:
    # Five wrong passwords over 8 minutes, each from another address: the username is what counts.
    wrong = []
    for n in range(5):
        wrong.append(_login("admin", f"guess-{n}", address=f"10.7.1.{n}").status_code)
        clock.advance(2 * MINUTE)

    sixth = _login("admin", "guess-5", address="10.7.1.9")

    assert wrong == [400] * 5
    _assert_locked(sixth, per="user", wait=900 - 120)  # 15 minutes from the fifth wrong password


def test_during_a_lockout_the_right_password_is_refused_too(admin: User, clock: Clock) -> None:
    for n in range(5):
        _login("admin", f"guess-{n}")
    clock.advance(MINUTE)
    client = APIClient(REMOTE_ADDR="10.7.2.1")

    right = client.post("/api/v1/auth/login/", {"username": "admin", "password": PASSWORD}, format="json")
    differently_written = _login(" Admin", PASSWORD, address="10.7.2.2")

    _assert_locked(right, per="user", wait=840)
    _assert_locked(differently_written, per="user", wait=840)
    assert client.get("/api/v1/me/").status_code in (401, 403)


def test_the_lockout_ends_after_15_minutes_and_the_count_starts_again(admin: User, clock: Clock) -> None:
    for n in range(5):
        _login("admin", f"guess-{n}", address=f"10.7.9.{n}")

    clock.advance(15 * MINUTE - 1)
    still = _login("admin", PASSWORD)
    clock.advance(1)
    after = _login("admin", PASSWORD)
    wrong_again = [_login("admin", f"again-{n}", address=f"10.7.10.{n}").status_code for n in range(5)]
    locked_again = _login("admin", PASSWORD)

    _assert_locked(still, per="user", wait=1)
    assert after.status_code == 200, after.content
    assert wrong_again == [400] * 5
    _assert_locked(locked_again, per="user", wait=900)


def test_wrong_passwords_more_than_15_minutes_apart_lock_nothing(admin: User, clock: Clock) -> None:
    early = [_login("admin", f"early-{n}").status_code for n in range(4)]
    clock.advance(15 * MINUTE + 1)  # the four slid out of the window
    late = [_login("admin", f"late-{n}").status_code for n in range(4)]

    assert early + late == [400] * 8
    assert _login("admin", PASSWORD).status_code == 200
    assert not SignInLockout.objects.exists()


def test_an_address_trying_many_usernames_is_locked_out(admin: User, clock: Clock) -> None:
    guesses = [_login(name, "123456", address="10.7.3.1").status_code for name in ("ana", "ben", "cy", "dee", "eve")]
    clock.advance(MINUTE)

    sixth_name = _login("fay", "123456", address="10.7.3.1")
    admin_from_there = _login("admin", PASSWORD, address="10.7.3.1")
    admin_elsewhere = _login("admin", PASSWORD, address="10.7.3.2")

    assert guesses == [400] * 5
    _assert_locked(sixth_name, per="ip", wait=840)
    _assert_locked(admin_from_there, per="ip", wait=840)
    assert admin_elsewhere.status_code == 200, admin_elsewhere.content
    (row,) = SignInLockout.objects.all()
    assert (row.per, row.identity, row.failures, row.last_username) == ("ip", "10.7.3.1", 5, "eve")


def test_another_username_is_not_locked_with_one(admin: User, clock: Clock) -> None:
    other = user_get_or_create(username="ops")
    other.set_password("ops-password")
    other.save()
    for n in range(5):
        _login("admin", f"guess-{n}", address=f"10.7.4.{n}")

    assert _login("ops", "ops-password", address="10.7.4.9").status_code == 200


def test_guesses_sent_in_parallel_are_counted_before_the_password_is_checked(clock: Clock) -> None:
    """Five checks still in flight: a sixth is refused without waiting for their answers."""
    in_flight = [sign_in_attempt(username="admin", address=f"10.7.5.{n}") for n in range(5)]

    with pytest.raises(SignInLocked) as refused:
        sign_in_attempt(username="admin", address="10.7.5.9")
    for attempt in in_flight:
        sign_in_failed(attempt)

    assert refused.value.refusal.kind == "user"
    assert 1 <= refused.value.refusal.retry_after <= 900
    assert SignInLockout.objects.filter(per="user", identity="admin").count() == 1


def test_redis_out_of_reach_counts_nothing_and_refuses_nobody(admin: User, settings: Any, clock: Clock) -> None:
    settings.REDIS_URL = "redis://127.0.0.1:1/0"
    settings.TRAINYARD = {**settings.TRAINYARD, "RATE_LIMITS": {}}  # the per-minute limits count in Redis too

    wrong = [_login("admin", f"guess-{n}").status_code for n in range(6)]

    assert wrong == [400] * 6
    assert _login("admin", PASSWORD).status_code == 200


# ------------------------------------------------------------------ what admins see


def test_admins_see_lockouts_in_the_django_admin_and_lift_them(admin: User, clock: Clock) -> None:
    for n in range(5):
        _login("admin", f"guess-{n}", address="10.7.6.1")
    operator = user_get_or_create(username="operator")
    operator.is_staff = operator.is_superuser = True
    operator.save()
    browser = Client()
    browser.force_login(operator)

    listing = browser.get("/admin/accounts/signinlockout/?state=active")
    row = SignInLockout.objects.get(per="user")
    lifted = browser.post(
        "/admin/accounts/signinlockout/", {"action": "lift", "_selected_action": [str(row.pk)]}, follow=True
    )

    assert listing.status_code == 200
    page = listing.content.decode()
    assert "admin" in page and "10.7.6.1" in page and "username" in page and "address" in page
    assert "Lifted 1 lockout(s)." in lifted.content.decode()
    _assert_locked(_login("admin", PASSWORD, address="10.7.6.1"), per="ip", wait=900)  # the address's still holds
    assert _login("admin", PASSWORD, address="10.7.6.2").status_code == 200


def test_the_django_admin_sign_in_is_locked_out_too_and_says_so(admin: User, clock: Clock) -> None:
    def admin_login(password: str) -> Any:
        client = Client(REMOTE_ADDR="10.7.7.1")
        return client.post("/admin/login/?next=/admin/", {"username": "admin", "password": password})

    wrong = [admin_login(f"guess-{n}") for n in range(5)]
    right = admin_login(PASSWORD)

    assert [r.status_code for r in wrong] == [200] * 5  # the form again, with its error
    assert all("Please enter the correct username and password" in r.content.decode() for r in wrong)
    assert right.status_code == 200, "signed in although locked out"
    assert "Too many wrong passwords for this account (5 within 15 minutes)" in right.content.decode()


def test_sign_in_unlock_lifts_a_lockout_from_the_command_line(admin: User, clock: Clock, capsys: Any) -> None:
    for n in range(5):
        _login("admin", f"guess-{n}", address=f"10.7.8.{n}")

    call_command("sign_in_unlock", "Admin")

    assert "Lifted 1 lockout(s) of 'Admin'." in capsys.readouterr().out
    assert _login("admin", PASSWORD).status_code == 200
