"""The values a submitter sends for a run besides the workflows: ``-e``
overrides and the bare ``env`` names' values from their shell. They are
treated as secrets (docs/SECURITY.md, "Secrets"):

- encrypted at rest, on the run (``Run.private_inputs``), never in a job's
  spec, whose ``private_env`` keeps a keyed digest of each (the cache key and
  "why not reused" still see a changed value);
- delivered with the job's secrets over the runner's authenticated fetch
  (``delivery.job_secrets``), never in the assignment frame (Redis);
- masked in the job's logs and reasons like the workspace's secrets.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any

from django.utils.crypto import salted_hmac

from backend.runs.lifecycle.devenvs import app_token_env
from backend.runs.models import Job, Run
from backend.vault.crypto import Unreadable, decrypt, encrypt
from backend.vault.masking import Masks
from backend.vault.services import masks_for


@dataclass(frozen=True)
class PrivateInputs:
    env: dict[str, str] = field(default_factory=dict)  # -e NAME=VALUE
    inherited_env: dict[str, str] = field(default_factory=dict)  # bare env names' values
    jobs: dict[str, dict[str, str]] = field(default_factory=dict)  # by job name, its variables of them

    def values(self) -> list[str]:
        return [*self.env.values(), *self.inherited_env.values(), *(v for j in self.jobs.values() for v in j.values())]


def private_names(*, env: Mapping[str, str], inherited_env: Mapping[str, str]) -> set[str]:
    """The variables a job's env takes from the submitter: kept out of its spec."""
    return set(env) | set(inherited_env)


def private_digest(name: str, value: str) -> str:
    """A keyed digest of one value: equal values compare equal, and the
    stored spec does not let anyone without the server's key test guesses."""
    return salted_hmac("trainyard.private-env", f"{name}={value}").hexdigest()


def private_seal(inputs: PrivateInputs) -> bytes | None:
    if not (inputs.env or inputs.inherited_env):
        return None
    data = {"env": inputs.env, "inherited_env": inputs.inherited_env, "jobs": inputs.jobs}
    return encrypt(json.dumps(data, sort_keys=True))


def private_inputs_of(run: Run) -> PrivateInputs:
    """The run's private inputs (a run stored before they were encrypted
    has them in plain ``env_overrides``/``inherited_env`` and spec env)."""
    if run.private_inputs is None:
        return PrivateInputs(env=dict(run.env_overrides), inherited_env=dict(run.inherited_env))
    data: dict[str, Any] = json.loads(decrypt(run.private_inputs))  # Unreadable: no key opens it
    return PrivateInputs(env=data["env"], inherited_env=data["inherited_env"], jobs=data["jobs"])


def job_masks(*, job: Job, private_env: bool, app_token: bool) -> Masks:
    """What to hide in the job's logs and reasons: its workspace's secrets,
    its run's private values (``private_env``: its spec has some) and its dev
    environment's token (``app_token``: it has one). The caller says both,
    read with the job (the log path reads them with its row, not per frame:
    ``private_env`` is in the job's spec, which it does not load)."""
    run_id, job_id = job.run_id, job.pk

    def values() -> list[str]:
        run = Run.objects.filter(pk=run_id).only("private_inputs", "env_overrides", "inherited_env").first()
        if run is None:
            return []
        try:
            return private_inputs_of(run).values()
        except Unreadable:
            return []  # no key opens them: the job was refused them too

    def token() -> list[str]:
        found = Job.objects.filter(pk=job_id).only("pk", "app_token", "spec").first()
        return list(app_token_env(found).values()) if found is not None else []

    if app_token:

        def both() -> list[str]:
            return [*token(), *(values() if private_env else [])]

        return masks_for(workspace_id=job.workspace_id, extra_key=f"job:{job_id}", extra=both)
    if not private_env:
        return masks_for(workspace_id=job.workspace_id)
    return masks_for(workspace_id=job.workspace_id, extra_key=str(run_id), extra=values)


def private_split(env: Mapping[str, str], names: Collection[str]) -> tuple[dict[str, str], dict[str, str]]:
    """``env`` as (what the spec keeps, the private values)."""
    public = {k: v for k, v in env.items() if k not in names}
    return public, {k: v for k, v in env.items() if k in names}
