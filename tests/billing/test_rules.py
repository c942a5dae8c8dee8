"""The billing rules on plain values: per-second billing with a 60 s
minimum per machine, an attempt's share, and money to a hundredth of a cent."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from decimal import Decimal

from backend.billing.rules import Machine, cost_of, held_seconds, idle_cost, machine_cost, machine_seconds

T = datetime(2026, 11, 2, 9, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T + timedelta(seconds=seconds)


def test_a_20_second_machine_bills_the_60_second_minimum() -> None:
    machine = Machine(Decimal("3.06"), running_at=T, terminated_at=at(20))
    assert machine_seconds(machine, now=at(999)) == 60
    # $3.06 an hour for 60 s: 3.06 / 60 = $0.051.
    assert machine_cost(machine, now=at(999)) == Decimal("0.0510")


def test_billing_is_per_second_rounded_up_and_a_live_machine_accrues_until_now() -> None:
    ended = Machine(Decimal("0.5"), running_at=T, terminated_at=at(3600.2))
    assert machine_seconds(ended, now=at(9999)) == 3601
    assert machine_cost(ended, now=at(9999)) == Decimal("0.5001")  # 0.5 x 3601 / 3600 = 0.500138…
    live = Machine(Decimal("0.5"), running_at=T, terminated_at=None)
    assert machine_cost(live, now=at(7200)) == Decimal("1.0000")
    assert machine_cost(live, now=at(10800)) == Decimal("1.5000")


def test_a_machine_that_never_said_hello_costs_nothing() -> None:
    assert machine_cost(Machine(Decimal("9"), running_at=None, terminated_at=None), now=at(100)) == 0


def test_an_attempt_holds_its_machine_from_acceptance_to_its_end_never_past_the_machines() -> None:
    machine = Machine(Decimal("1.2"), running_at=T, terminated_at=at(500))
    assert held_seconds(at(10), at(310), machine, now=at(999)) == 300
    # Interrupted: the attempt is ended after the machine is gone; the machine's end bounds it.
    assert held_seconds(at(10), at(700), machine, now=at(999)) == 490
    assert held_seconds(None, None, machine, now=at(999)) == 0
    live = Machine(Decimal("1.2"), running_at=T, terminated_at=None)
    assert held_seconds(at(10), None, live, now=at(130)) == 120
    # $1.20 an hour for 300 s: $0.10.
    assert cost_of(Decimal("1.2"), 300) == Decimal("0.1000")


def test_a_reused_machines_time_between_jobs_is_idle() -> None:
    # On from 0 to 1000 s at $3.60/h ($1.00 per 1000 s): job A held 100..400, job B 600..900.
    machine = Machine(Decimal("3.6"), running_at=T, terminated_at=at(1000))
    shares = [
        cost_of(Decimal("3.6"), held_seconds(at(a), at(b), machine, at(2000))) for a, b in ((100, 400), (600, 900))
    ]
    assert shares == [Decimal("0.3000"), Decimal("0.3000")]
    assert idle_cost(machine, shares, now=at(2000)) == Decimal("0.4000")
    assert machine_cost(machine, now=at(2000)) == sum(shares) + Decimal("0.4000")


def test_the_rest_of_the_minimum_is_idle() -> None:
    machine = Machine(Decimal("3.6"), running_at=T, terminated_at=at(25))
    share = cost_of(Decimal("3.6"), held_seconds(at(5), at(20), machine, at(99)))
    assert share == Decimal("0.0150")  # 15 s
    assert idle_cost(machine, [share], now=at(99)) == Decimal("0.0450")  # 60 s billed - 15 s held
