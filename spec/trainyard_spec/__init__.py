"""trainyard-spec: the workflow-file schema and the provider SDK, shared by the
``trainyard`` CLI and the Trainyard server (neither depends on the other).

A provider plugin needs only what is exported here::

    from trainyard_spec import JobPlan, Provider, ProviderError, Workflow, job_plan

Modules, each importing only the ones before it: ``schema`` (the keys of a
workflow, resource sizes, errors), ``providers`` (the SDK, the built-in
providers and the plugin registry), ``workflows`` (loading the workflows files), ``variables`` (the variables
file) and ``planning`` (the jobs of a run, in dependency order).
"""

from __future__ import annotations

from .planning import (
    OVERRIDABLE_RESOURCES,
    ResourceOverrideError,
    RunPlan,
    inherited_env_names,
    resolve_run_plan,
    resource_overrides,
    run_workflows,
)
from .providers import JobPlan, Provider, ProviderError, ProviderNotFound, get_provider, job_plan, plugin_names
from .schema import ResourceSpec, Workflow, WorkflowError, WorkflowFileError
from .variables import Variables, find_variables_file, load_variables
from .workflows import (
    Source,
    WorkflowsFile,
    find_workflows_file,
    find_workflows_files,
    load_workflows,
    load_workflows_file,
)

__version__ = "0.1.0"
__all__ = [
    "OVERRIDABLE_RESOURCES",
    "JobPlan",
    "Provider",
    "ProviderError",
    "ProviderNotFound",
    "ResourceOverrideError",
    "ResourceSpec",
    "RunPlan",
    "Source",
    "Variables",
    "Workflow",
    "WorkflowError",
    "WorkflowFileError",
    "WorkflowsFile",
    "find_variables_file",
    "find_workflows_file",
    "find_workflows_files",
    "get_provider",
    "inherited_env_names",
    "job_plan",
    "load_variables",
    "load_workflows",
    "load_workflows_file",
    "plugin_names",
    "resolve_run_plan",
    "resource_overrides",
    "run_workflows",
]
