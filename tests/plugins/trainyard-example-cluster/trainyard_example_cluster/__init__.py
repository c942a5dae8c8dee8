"""An example Trainyard provider: a cluster of one master job and N workers.

    workflows:
      - name: train-dist
        provider: cluster
        workers: 2
        port: 29500
        master: [python -m myapp.master --port "$MASTER_PORT"]
        worker: [python -m myapp.worker --connect "$TRAINYARD_MASTER_HOST:$TRAINYARD_MASTER_PORT"]
        resources: {cpu: 2}

makes ``train-dist-master`` (listening on ``port``) and ``train-dist-worker-1``
… ``train-dist-worker-N``. A worker starts once the master is running; the
server gives it ``TRAINYARD_MASTER_HOST`` and ``TRAINYARD_MASTER_PORT``, and
the provider gives it ``WORKER_INDEX`` (1…N). The workflow's artifacts are the
master's. docs/providers.md walks through this file.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field
from trainyard_spec import JobPlan, Provider, Workflow, job_plan


class ClusterOptions(BaseModel):
    """The workflow keys the cluster provider adds."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    workers: Annotated[int, Field(strict=True, ge=1, le=16)]
    master: list[Annotated[str, Field(strict=True)]]
    worker: list[Annotated[str, Field(strict=True)]]
    port: Annotated[int, Field(strict=True, ge=1, le=65535)]


class ClusterProvider(Provider):
    name = "cluster"
    options = ClusterOptions

    def jobs(self, wf: Workflow, *, env: dict[str, str], options: BaseModel | None) -> list[JobPlan]:
        assert isinstance(options, ClusterOptions)
        master = job_plan(
            wf,
            name=f"{wf.name}-master",
            commands=options.master,
            env={**env, "MASTER_PORT": str(options.port)},
            ports=[options.port],
        )
        workers = [
            job_plan(
                wf,
                name=f"{wf.name}-worker-{i}",
                commands=options.worker,
                env={**env, "WORKER_INDEX": str(i)},
                artifacts=[],
                ports=[],
                after_running=[master.name],
            )
            for i in range(1, options.workers + 1)
        ]
        return [master, *workers]
