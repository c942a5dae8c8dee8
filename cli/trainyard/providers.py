"""Deprecated: the provider SDK moved to ``trainyard_spec`` (the package the
server imports too). Kept so that plugins written as
``from trainyard.providers import Provider, JobPlan, job_plan`` still work
where the CLI is installed; the classes are the same objects. On a server,
which does not install the CLI, such a plugin fails to load with a message
that says where to import from (docs/providers.md).
"""

from __future__ import annotations

import warnings

from trainyard_spec.planning import RunPlan, resolve_run_plan
from trainyard_spec.providers import (
    ENTRY_POINT_GROUP,
    JobPlan,
    Provider,
    ProviderError,
    ProviderNotFound,
    get_provider,
    job_plan,
    plugin_names,
    python_commands,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "JobPlan",
    "Provider",
    "ProviderError",
    "ProviderNotFound",
    "RunPlan",
    "get_provider",
    "job_plan",
    "plugin_names",
    "python_commands",
    "resolve_run_plan",
]

warnings.warn(
    "trainyard.providers is deprecated: import the provider SDK from trainyard_spec",
    DeprecationWarning,
    stacklevel=2,
)
