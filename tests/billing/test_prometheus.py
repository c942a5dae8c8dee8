"""The running set's cost per hour at /metrics (real ASGI server), per workspace."""

from __future__ import annotations

import pytest

from backend.accounts.models import Workspace
from tests.billing.test_selectors import machine
from tests.ops.test_endpoints import TOKEN, scrape
from tests.support.fixtures import Person
from tests.support.web import WebServers

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_running_cost_per_hour_sums_each_workspaces_live_machines(
    team: Workspace, outsider: Person, web_server: WebServers
) -> None:
    machine(team, "2.5236", 0, None)
    machine(team, "0.9648", 0, None)
    machine(team, "9.0", 0, 100)  # terminated: not running
    machine(outsider.user.personal_workspace, "0.5", 0, None)
    server = web_server.start(TRAINYARD_METRICS_TOKEN=TOKEN)

    scraped = scrape(server)

    assert scraped[("trainyard_running_cost_per_hour", (("workspace", "acme"),))] == pytest.approx(3.4884)
    theirs = outsider.user.personal_workspace.slug
    assert scraped[("trainyard_running_cost_per_hour", (("workspace", theirs),))] == pytest.approx(0.5)
