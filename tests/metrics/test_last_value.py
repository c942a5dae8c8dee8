"""A step metric's last value is the one of its highest step when several
values share a time (lines of the metrics file read in one pass): the run
page and the compare page show it as the run's final value."""

from __future__ import annotations

import pytest

from backend.accounts.models import Workspace
from backend.metrics import selectors
from backend.metrics.models import AttemptMetrics, TrainingBlock
from backend.runs.models import Run
from tests.metrics.test_ingest import T0, _metrics, _running, _send, _value

pytestmark = pytest.mark.django_db(transaction=True)


def test_of_values_read_together_the_highest_step_is_the_last(team: Workspace, run: Run) -> None:
    job, _ = _running(team, run)
    read_together = [_value("loss", 0.5, T0, step=5), _value("loss", 0.4, T0, step=6), _value("loss", 0.6, T0, step=4)]
    _send(
        "r1-secret",
        job,
        1,
        [_metrics(job, 1, training=read_together)],
        then=lambda: TrainingBlock.objects.filter(job=job).exists(),
    )
    last = AttemptMetrics.objects.get(job=job).last["loss"]
    assert (last["step"], last["value"]) == (6, 0.4)
    summary = selectors.run_metrics(run)[0]["last"]["loss"]
    assert (summary["step"], summary["value"]) == (6, 0.4)
