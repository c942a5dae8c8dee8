"""What billing tells the rest of the server, without importing it.

``budget_raised`` is sent once a change that gives a budget more room has
committed: its ``monthly_limit`` raised or taken off, or the budget removed.
Keyword arguments: ``workspace_id`` (UUID) and ``user_id`` (int: a member's
budget; None: the workspace's). ``backend.runs`` connects
``backend.runs.services.budgets.budget_raised`` to it in its AppConfig
(jobs the budget stopped resume from their checkpoint); billing imports
nothing of runs (docs/ARCHITECTURE.md)."""

from __future__ import annotations

from django.dispatch import Signal

budget_raised = Signal()
