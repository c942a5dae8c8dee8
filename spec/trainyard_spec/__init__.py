"""trainyard-spec: the workflow-file schema and the provider SDK, shared by the
``trainyard`` CLI and the Trainyard server (neither depends on the other).

A provider plugin needs only what is exported here::

    from trainyard_spec import JobPlan, Provider, ProviderError, Workflow, job_plan

Modules, each importing only the ones before it: ``schema`` (the keys of a
workflow, resource sizes, errors), ``providers`` (the SDK, the built-in
providers and the plugin registry), ``workflows`` (loading a whole file) and
``planning`` (the jobs of a run, in dependency order).
"""

from __future__ import annotations

from .planning import RunPlan, resolve_run_plan
from .providers import JobPlan, Provider, ProviderError, ProviderNotFound, get_provider, job_plan, plugin_names
from .schema import ResourceSpec, Workflow, WorkflowError, WorkflowFileError
from .workflows import WorkflowsFile, find_workflows_file, load_workflows_file

__version__ = "0.1.0"
__all__ = [
    "JobPlan",
    "Provider",
    "ProviderError",
    "ProviderNotFound",
    "ResourceSpec",
    "RunPlan",
    "Workflow",
    "WorkflowError",
    "WorkflowFileError",
    "WorkflowsFile",
    "find_workflows_file",
    "get_provider",
    "job_plan",
    "load_workflows_file",
    "plugin_names",
    "resolve_run_plan",
]
