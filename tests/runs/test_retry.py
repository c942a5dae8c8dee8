"""retry_decide: which ended attempts are tried again."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from backend.runs.lifecycle.retry import RetryPolicy, retry_decide
from backend.runs.reasons import TerminationReason as R

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)


def decide(spec: dict[str, object], reason: R, attempts: int = 1, started: timedelta = timedelta(minutes=5)) -> bool:
    policy = RetryPolicy.from_spec(spec)
    return retry_decide(policy=policy, reason=reason, attempts=attempts, first_started_at=NOW - started, now=NOW).retry


@pytest.mark.parametrize(
    ("reason", "retried"),
    [(R.INTERRUPTED, True), (R.INSTANCE_LOST, True), (R.UNREACHABLE, True), (R.ERROR, False), (R.NO_CAPACITY, False)],
)
def test_the_defaults_retry_lost_and_interrupted_machines_never_errors(reason: R, retried: bool) -> None:
    assert decide({}, reason) is retried


def test_the_defaults_stop_at_5_attempts_and_after_an_hour() -> None:
    assert decide({}, R.INSTANCE_LOST, attempts=4) is True
    assert decide({}, R.INSTANCE_LOST, attempts=5) is False
    assert decide({}, R.INSTANCE_LOST, started=timedelta(minutes=61)) is False


def test_retry_false_is_one_attempt_and_off_is_no_time_limit() -> None:
    assert decide({"on_events": [], "limit": 1}, R.INSTANCE_LOST) is False
    assert decide({"duration": 0}, R.INSTANCE_LOST, started=timedelta(days=3)) is True


def test_a_lease_that_ran_out_is_always_tried_again() -> None:
    assert decide({"on_events": [], "limit": 1}, R.LEASE_EXPIRED, attempts=9) is True


def test_error_is_retried_when_asked_up_to_the_limit() -> None:
    spec = {"on_events": ["error"], "limit": 2}
    assert (decide(spec, R.ERROR, attempts=1), decide(spec, R.ERROR, attempts=2)) == (True, False)
