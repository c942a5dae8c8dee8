"""`trainyard ps` and the SDK's ``iter_runs`` page through the runs list by
its cursor, against the real web server (uvicorn on the test database)."""

from __future__ import annotations

import pytest
from click.testing import CliRunner
from trainyard.api import Client
from trainyard.cli import cli

from backend.accounts.models import Workspace
from tests.support.fixtures import Person, submit
from tests.support.web import WebServers


@pytest.mark.django_db(transaction=True)
def test_iter_runs_follows_the_cursor_through_every_run_once_newest_first(
    team: Workspace, owner: Person, web_server: WebServers
) -> None:
    made = [submit(team, owner.user).name for _ in range(7)]
    server = web_server.start()

    with Client(server.url, owner.token, "acme") as client:
        first = client.list_runs(page_size=3)
        seen = [r["name"] for r in client.iter_runs(page_size=3)]

    assert seen == list(reversed(made))
    assert (first["count"], first["count_estimated"], len(first["results"])) == (7, False, 3)
    assert "cursor=" in (first["next"] or "")


@pytest.mark.django_db(transaction=True)
def test_ps_all_lists_runs_across_pages(
    team: Workspace, owner: Person, web_server: WebServers, monkeypatch: pytest.MonkeyPatch
) -> None:
    made = [submit(team, owner.user).name for _ in range(105)]  # ps asks for pages of 100
    server = web_server.start()
    monkeypatch.setenv("TRAINYARD_URL", server.url)
    monkeypatch.setenv("TRAINYARD_TOKEN", owner.token)
    monkeypatch.setenv("TRAINYARD_WORKSPACE", "acme")

    result = CliRunner().invoke(cli, ["ps", "-a"])

    assert result.exit_code == 0, result.output
    names = [line.split()[0] for line in result.output.splitlines()[1:]]
    assert names == list(reversed(made))
