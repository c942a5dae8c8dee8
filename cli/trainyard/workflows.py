"""Deprecated: the workflow-file schema moved to ``trainyard_spec`` (the
package the server imports too). Kept so that plugins written as
``from trainyard.workflows import Workflow`` still work where the CLI is
installed; the classes are the same objects.
"""

from __future__ import annotations

import warnings

from trainyard_spec.schema import ResourceSpec, Workflow, WorkflowError, WorkflowFileError, resource_spec
from trainyard_spec.workflows import WORKFLOW_FILES, WorkflowsFile, find_workflows_file, load_workflows_file

__all__ = [
    "WORKFLOW_FILES",
    "ResourceSpec",
    "Workflow",
    "WorkflowError",
    "WorkflowFileError",
    "WorkflowsFile",
    "find_workflows_file",
    "load_workflows_file",
    "resource_spec",
]

warnings.warn(
    "trainyard.workflows is deprecated: import the workflow schema from trainyard_spec",
    DeprecationWarning,
    stacklevel=2,
)
