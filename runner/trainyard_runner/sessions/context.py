"""What a session into a job runs with: the job's working tree, its
environment as its commands get it, and its user (``Job.session_context``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path


@dataclass(frozen=True)
class SessionContext:
    """``uid``/``gid``: the job's own user on a root runner (jobuser.py); None:
    the runner's user (a runner that is not root cannot change users).
    ``env`` never holds the runner's token."""

    cwd: Path
    env: dict[str, str] = field(default_factory=dict)
    uid: int | None = None
    gid: int | None = None
