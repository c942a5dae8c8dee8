"""A machine's root volume is billed with it: an AWS offer names gp3's
price per GiB-month, and the machine's price per hour is its compute and
that storage (its GiB x the price / 730 hours), so every attempt and its
idle time carry their share (docs/COST.md, "Per backend")."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest

from backend.clouds.backends.aws.catalog import GP3_GIB_MONTH
from backend.clouds.backends.base import Offer
from backend.clouds.services.instances import instance_request, price_source, root_volume_price_per_hour

pytestmark = pytest.mark.django_db

GIB = 2**30


def aws_offer(disk_gib: int, *, price: float = 0.192, source: str = "catalog") -> Offer:
    data = {"catalog_date": "20261101", "price_source": source, "root_volume_gib_month": GP3_GIB_MONTH}
    return Offer(
        backend="aws",
        instance_type="m6i.large",
        region="us-east-1",
        cpus=2,
        memory_bytes=8 * GIB,
        disk_bytes=disk_gib * GIB,
        price_per_hour=price,
        data=data,
    )


def test_a_100_gib_root_volume_costs_its_share_of_gp3s_monthly_price_an_hour() -> None:
    # 100 GiB x $0.08 / 730 h = $0.010958904… an hour.
    assert root_volume_price_per_hour(aws_offer(100)) == Decimal("0.010959")
    assert root_volume_price_per_hour(aws_offer(200)) == Decimal("0.021918")
    assert price_source(aws_offer(100)) == "catalog 20261101 + root volume 100 GiB at $0.08/GiB-month"
    spot = aws_offer(100, source="spot-history")
    assert price_source(spot) == "spot price history at launch + root volume 100 GiB at $0.08/GiB-month"


def test_an_offer_without_a_storage_price_adds_nothing() -> None:
    local = Offer(backend="local", instance_type="local", region="", cpus=2, memory_bytes=GIB, disk_bytes=GIB)
    assert root_volume_price_per_hour(local) == 0
    assert price_source(local) == "none: a machine nobody sells"


def test_the_machines_price_is_its_compute_and_its_storage_and_its_cost_follows(fake_offers: Any, team: Any) -> None:
    account = fake_offers(("m6i.large", 0.192))
    machine = instance_request(account=account, offer=aws_offer(100), job_id=None, reason_text="test")
    machine.refresh_from_db()
    assert machine.storage_price_per_hour == Decimal("0.010959")
    assert machine.price_per_hour == Decimal("0.192") + Decimal("0.010959")
    assert machine.price_source.endswith("+ root volume 100 GiB at $0.08/GiB-month")


def test_aws_offers_name_gp3s_price_for_their_root_volume() -> None:
    from backend.clouds.backends.aws.catalog import load_catalog
    from backend.clouds.backends.aws.compute import _row_offers
    from backend.clouds.backends.base import Requirements

    row = next(r for r in load_catalog() if r.instance_type == "m6i.large" and not r.spot)
    (offer,) = _row_offers("aws", row, None, Requirements(), spot_prices=False)
    assert offer.data["root_volume_gib_month"] == "0.08" and offer.disk_bytes == 100 * GIB


def test_a_jobs_estimate_counts_its_root_volume_as_the_machine_is_billed() -> None:
    from backend.runs.services.admission import job_estimate

    offer = {"offers": 1, "price_per_hour": 0.192, "storage_price_per_hour": 0.010959}
    estimate = job_estimate(job="train", offer=offer, placement={"max_duration": 3600 * 10})
    assert estimate.price_per_hour == Decimal("0.202959")
    assert estimate.max_cost == Decimal("2.0296")  # 10 h at $0.202959/h, to a hundredth of a cent
