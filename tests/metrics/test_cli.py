"""`trainyard metrics` and `trainyard show` against the real web server
(uvicorn on the test database), on metrics stored through the ingestion
path: the table with sparklines, CSV (appending while it follows), JSON,
and show's last values."""

from __future__ import annotations

import csv
import io
import json
import threading
import time
from typing import Any

import pytest
from click.testing import CliRunner
from trainyard.cli import cli
from trainyard_runner import protocol

from backend.accounts.models import Workspace
from backend.metrics.services.ingest import record_metrics
from backend.runs.models import Run, RunStatus
from tests.metrics.test_ingest import T0, _running, _sample, _value
from tests.support.fixtures import Person
from tests.support.web import WebServers

pytestmark = pytest.mark.django_db(transaction=True)


def _feed(run: Run, instance: Any, steps: range) -> None:
    job = run.jobs.get()
    message = protocol.Metrics(
        job=str(job.pk),
        attempt=1,
        system=[_sample(T0 + 5 * s, cpu=90.0 + s % 10, rss=(200 + s) << 20, gpus=[80.0, 0.0]) for s in steps],
        training=[_value("loss", 2.0 / (s + 1), T0 + 5 * s, step=s) for s in steps],
    )
    assert record_metrics(instance_id=str(instance.pk), message=message)


@pytest.fixture
def cli_env(team: Workspace, run: Run, owner: Person, web_server: WebServers, monkeypatch: pytest.MonkeyPatch) -> Any:
    server = web_server.start()
    monkeypatch.setenv("TRAINYARD_URL", server.url)
    monkeypatch.setenv("TRAINYARD_TOKEN", owner.token)
    monkeypatch.setenv("TRAINYARD_WORKSPACE", "acme")
    return server


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


def test_the_table_shows_each_metrics_last_value_range_and_sparkline(team: Workspace, run: Run, cli_env: Any) -> None:
    _, instance = _running(team, run)
    _feed(run, instance, range(20))

    result = _invoke("metrics", run.name)

    assert result.exit_code == 0, result.output
    rows = {line.split()[1]: line.split() for line in result.output.splitlines()[1:]}
    assert list(rows) == ["loss", "cpu", "memory", "gpu0.util", "gpu0.memory", "gpu1.util", "gpu1.memory"]
    loss = rows["loss"]
    assert loss[:8] == ["hello", "loss", "1", "step", "19", "0.1", "0.1", "2"]
    assert loss[8][0] == "█" and loss[8][-1] == "▁" and len(loss[8]) == 20  # falling
    assert rows["cpu"][4:7] == ["99%", "90%", "99%"]  # last, min, max
    assert rows["memory"][4:6] == ["219.0", "MiB"]

    only = _invoke("metrics", run.name, "--name", "gpu0.util", "--job", "hello")
    assert [line.split()[1] for line in only.output.splitlines()[1:]] == ["gpu0.util"]
    missing = _invoke("metrics", run.name, "--job", "nope")
    assert missing.exit_code == 1 and "has no job 'nope'; its jobs: hello" in missing.output

    shown = _invoke("show", run.name)
    assert "Metrics (trainyard metrics RUN):" in shown.output
    assert (
        "  hello: loss 0.1 (step 19), cpu 99%, memory 219.0 MiB, gpu0 80% 0 B/16.0 GiB, gpu1 0% 1.0 GiB/16.0 GiB"
        in (shown.output)
    )


def test_json_and_csv_give_every_point(team: Workspace, run: Run, cli_env: Any) -> None:
    _, instance = _running(team, run)
    _feed(run, instance, range(5))

    answer = json.loads(_invoke("metrics", run.name, "--json", "--name", "loss").output)
    assert answer[0]["job"] == "hello" and answer[0]["series"][0]["points"]["x"] == [0, 1, 2, 3, 4]

    rows = list(csv.reader(io.StringIO(_invoke("metrics", run.name, "--csv", "--name", "loss,cpu").output)))
    assert rows[0] == ["job", "metric", "attempt", "x", "y", "min", "max"]
    assert rows[1] == ["hello", "loss", "1", "0", "2", "", ""]
    assert ["hello", "cpu", "1", str(int(T0)), "90", "90", "90"] in rows
    assert len(rows) == 1 + 5 + 5
    both = _invoke("metrics", run.name, "--json", "--csv")
    assert both.exit_code == 1 and "choose one" in both.output


def test_following_appends_each_new_point_once_until_the_run_ends(team: Workspace, run: Run, cli_env: Any) -> None:
    _, instance = _running(team, run)
    _feed(run, instance, range(3))

    def later() -> None:
        time.sleep(1.5)
        _feed(run, instance, range(3, 6))
        Run.objects.filter(pk=run.pk).update(status=RunStatus.SUCCEEDED)  # as its job's end would make it

    feeder = threading.Thread(target=later)
    feeder.start()
    started = time.monotonic()
    result = _invoke("metrics", run.name, "--follow", "--csv", "--name", "loss")
    feeder.join()

    assert result.exit_code == 0, result.output
    rows = list(csv.reader(io.StringIO(result.output)))
    assert [row[3] for row in rows[1:]] == ["0", "1", "2", "3", "4", "5"]
    assert time.monotonic() - started < 20
