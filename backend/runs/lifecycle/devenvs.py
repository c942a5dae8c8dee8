"""Dev environments (``provider: code | lab | notebook``): jobs that stay up
for a person to work in, until stopped or idle for their
``inactivity_duration`` (docs/decisions/0104-dev-environments.md).

- ``Job.spec["dev_environment"]``: ``{"kind", "inactivity_duration"}`` as
  planned (seconds, "off", or None for the workspace's
  ``TRAINYARD_DEV_INACTIVITY_SECONDS``).
- A Jupyter job (lab, notebook) serves on its first free port (``PORT_0``)
  and has a token the server made for it (``Job.app_token``, encrypted at
  rest like the workspace's secrets). The runner fetches it with the job's
  secrets as ``JUPYTER_TOKEN`` (never in the assignment frame); the app
  proxy sends it for the person (``app_request_headers``); it is masked in
  the job's log.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from trainyard_spec.providers import JUPYTER_TOKEN_VARIABLE

from backend.runs.models import Job
from backend.vault.crypto import Unreadable, decrypt, encrypt

JUPYTER_KINDS = ("lab", "notebook")


@dataclass(frozen=True)
class DevEnvironment:
    kind: str  # "code", "lab" or "notebook"
    inactivity_seconds: int | None  # None: never stopped for being idle

    @property
    def serves_app(self) -> bool:
        return self.kind in JUPYTER_KINDS

    def idle_words(self) -> str:
        """``1h``, ``30m``, ``45s``: how long it may stay idle, as a person writes it."""
        seconds = self.inactivity_seconds or 0
        for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
            if seconds >= size and seconds % size == 0:
                return f"{seconds // size}{unit}"
        return f"{seconds}s"


def dev_environment_of(spec: Mapping[str, Any]) -> DevEnvironment | None:
    """The dev environment a job's spec is, None for any other job."""
    found = spec.get("dev_environment")
    if not isinstance(found, Mapping):
        return None
    idle = found.get("inactivity_duration")
    if idle == "off":
        seconds = None
    elif isinstance(idle, int) and idle > 0:
        seconds = idle
    else:
        seconds = int(settings.TRAINYARD["DEV_INACTIVITY_SECONDS"])
    return DevEnvironment(kind=str(found.get("kind", "")), inactivity_seconds=seconds)


def dev_environment_shown(spec: Mapping[str, Any], ports: list[int]) -> dict[str, Any] | None:
    """A job's dev environment as the API shows it (``DevEnvironmentOut``), None for another job."""
    found = dev_environment_of(spec)
    if found is None:
        return None
    port = int(ports[0]) if found.serves_app and ports else None
    return {"kind": found.kind, "inactivity_seconds": found.inactivity_seconds, "app_port": port}


def app_token_seal(spec: Mapping[str, Any]) -> bytes | None:
    """A new token for a job of ``spec``, encrypted (None: not a Jupyter job)."""
    found = dev_environment_of(spec)
    if found is None or not found.serves_app:
        return None
    return encrypt(secrets.token_urlsafe(32))


def app_token(job: Job) -> str:
    """The job's Jupyter token ("" for another job); ``Unreadable`` when no key opens it."""
    if job.app_token is None:
        return ""
    return decrypt(job.app_token)


def app_token_env(job: Job) -> dict[str, str]:
    """What the job's runner fetches with its secrets: ``JUPYTER_TOKEN``."""
    try:
        token = app_token(job)
    except Unreadable:
        return {}
    return {JUPYTER_TOKEN_VARIABLE: token} if token else {}


def app_port(job: Job) -> int | None:
    """The port the job's Jupyter serves on (its first free port), once its runner picked it."""
    shown = dev_environment_shown(job.spec, job.ports)
    return shown["app_port"] if shown is not None else None


def app_request_headers_of(job: Job, port: int) -> dict[str, str]:
    """What the app proxy sends to ``port`` of ``job`` for the person: a
    Jupyter dev environment's token on its Jupyter port; nothing otherwise
    (a token no key opens: nothing, and Jupyter asks for one)."""
    if port != app_port(job):
        return {}
    try:
        token = app_token(job)
    except Unreadable:
        return {}
    return {"Authorization": f"token {token}"} if token else {}
