"""Tenant fixtures for these tests, and a fake cloud account whose offers
price the estimates (state only: nothing is launched)."""

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.support.fixtures import *  # noqa: F403

GIB = 2**30


@pytest.fixture
def fake_offers(team: Any, tmp_path: Path, settings: Any) -> Callable[..., Any]:
    """Connects a fake account to ``team`` offering ``(instance type, USD/h)``
    machines; the local backend off, so these are the only offers."""
    from backend.clouds.models import CloudAccount

    settings.TRAINYARD = {**settings.TRAINYARD, "LOCAL_BACKEND_ENABLED": False}

    def connect(*offers: tuple[str, float]) -> Any:
        listed = [
            {"instance_type": name, "region": "r1", "price_per_hour": price, "cpus": 2, "memory_bytes": 4 * GIB}
            for name, price in offers
        ]
        config = {"state_dir": str(tmp_path / "state"), "offers": listed}
        return CloudAccount.objects.create(workspace=team, kind="fake", name="fake", config=config)

    return connect
