"""The billing rules, on plain values (no database): EC2's per-second
billing with a 60 s minimum per machine, an attempt's share of its machine,
and the rounding of money (docs/COST.md, "How a cost is computed").

Every amount is ``Decimal`` USD quantized to ``MONEY`` (a hundredth of a
cent) per attempt and per machine; sums of those are exact, so a run's cost
is exactly the sum of its attempts' and a machine's cost exactly its
attempts' plus its idle share."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Protocol

MONEY = Decimal("0.0001")
MINIMUM_SECONDS = 60
HOUR = Decimal(3600)


@dataclass(frozen=True)
class Machine:
    """What billing needs of an instance: its price, and when it ran
    (``running_at`` None: it never said hello, nothing billed)."""

    price_per_hour: Decimal
    running_at: datetime | None
    terminated_at: datetime | None


@dataclass(frozen=True)
class AttemptBill:
    """An attempt's share of its machine: the machine's price, the seconds
    the attempt held it, and their cost."""

    price_per_hour: Decimal
    seconds: int
    cost: Decimal


def attempt_bill(
    started_at: datetime | None, finished_at: datetime | None, machine: Machine, now: datetime
) -> AttemptBill:
    """What an attempt costs: its machine's price × the seconds it held it."""
    seconds = held_seconds(started_at, finished_at, machine, now)
    return AttemptBill(machine.price_per_hour, seconds, cost_of(machine.price_per_hour, seconds))


class Priced(Protocol):
    """What billing reads of an instance row."""

    price_per_hour: Decimal
    running_at: datetime | None
    terminated_at: datetime | None


def billed_machine(instance: Priced) -> Machine:
    """The billing view of an instance row."""
    return Machine(Decimal(instance.price_per_hour), instance.running_at, instance.terminated_at)


def money(amount: Decimal) -> Decimal:
    return amount.quantize(MONEY, rounding=ROUND_HALF_UP)


def cost_of(price_per_hour: Decimal, seconds: int) -> Decimal:
    """``seconds`` of a machine at ``price_per_hour``, to the hundredth of a cent."""
    return money(Decimal(price_per_hour) * seconds / HOUR)


def machine_seconds(machine: Machine, now: datetime) -> int:
    """The seconds a machine is billed for: from ``running_at`` to
    ``terminated_at`` (else now), whole seconds rounded up, at least
    ``MINIMUM_SECONDS``; 0 for one that never ran."""
    if machine.running_at is None:
        return 0
    end = machine.terminated_at or now
    return max(MINIMUM_SECONDS, math.ceil(max(0.0, (end - machine.running_at).total_seconds())))


def held_seconds(started_at: datetime | None, finished_at: datetime | None, machine: Machine, now: datetime) -> int:
    """The whole seconds (rounded to nearest) an attempt held its machine:
    from ``started_at`` (its assignment accepted) to ``finished_at``, else
    to the machine's end (``terminated_at``, else now); never past the
    machine's end."""
    if started_at is None:
        return 0
    end = finished_at or machine.terminated_at or now
    if machine.terminated_at is not None:
        end = min(end, machine.terminated_at)
    return max(0, round((end - started_at).total_seconds()))


def machine_cost(machine: Machine, now: datetime) -> Decimal:
    return cost_of(machine.price_per_hour, machine_seconds(machine, now))


def idle_cost(machine: Machine, attempt_costs: list[Decimal], now: datetime) -> Decimal:
    """The part of a machine's cost no attempt held: the time between jobs,
    before the first and after the last, and the rest of the 60 s minimum
    (never below 0)."""
    return max(Decimal(0), machine_cost(machine, now) - sum(attempt_costs, Decimal(0)))
