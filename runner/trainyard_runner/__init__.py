"""trainyard-runner: the agent that runs Trainyard jobs on a machine."""

from __future__ import annotations

__version__ = "0.1.0"
