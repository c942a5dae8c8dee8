"""Per-job gauges at /metrics for running jobs (real ASGI server, samples
stored through the ingestion path): CPU, memory and each GPU's utilisation
and memory, labelled by workspace, run, job (and GPU) only; a job that has
ended leaves them."""

from __future__ import annotations

import pytest
from trainyard_runner import protocol

from backend.accounts.models import Workspace
from backend.metrics.services.ingest import record_metrics
from backend.runs.models import Run
from tests.metrics.test_ingest import T0, _running, _sample
from tests.ops.test_endpoints import TOKEN, scrape
from tests.support.attempts import report
from tests.support.web import WebServers

pytestmark = pytest.mark.django_db(transaction=True)


def test_running_jobs_have_cpu_memory_and_gpu_gauges(team: Workspace, run: Run, web_server: WebServers) -> None:
    job, instance = _running(team, run)
    sample = _sample(T0, cpu=187.5, rss=3 << 30, gpus=[91.0, 4.0])
    assert record_metrics(
        instance_id=str(instance.pk), message=protocol.Metrics(job=str(job.pk), attempt=1, system=[sample])
    )
    server = web_server.start(TRAINYARD_METRICS_TOKEN=TOKEN)

    scraped = scrape(server)

    labels = (("job", "hello"), ("run", run.name), ("workspace", "acme"))
    assert scraped[("trainyard_job_cpu_percent", labels)] == 187.5
    assert scraped[("trainyard_job_memory_bytes", labels)] == 3 << 30
    for gpu, util in (("0", 91.0), ("1", 4.0)):
        with_gpu = tuple(sorted((*labels, ("gpu", gpu))))
        assert scraped[("trainyard_job_gpu_utilization_percent", with_gpu)] == util
        assert scraped[("trainyard_job_gpu_memory_used_bytes", with_gpu)] == int(gpu) << 30
        assert scraped[("trainyard_job_gpu_memory_total_bytes", with_gpu)] == 16 << 30
    job_series = {key for key in scraped if key[0].startswith("trainyard_job_")}
    assert {name for key in job_series for name, _ in key[1]} == {"workspace", "run", "job", "gpu"}

    assert report(job, instance.pk, "succeeded", exit_code=0)
    assert not [key for key in scrape(server) if key[0].startswith("trainyard_job_")]
