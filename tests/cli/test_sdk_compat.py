"""The provider SDK's old import paths, kept in the CLI for plugins written before trainyard-spec."""

from __future__ import annotations

import importlib
import sys

import pytest
import trainyard_spec


@pytest.mark.parametrize(
    ("module", "names"),
    [
        ("trainyard.providers", ["Provider", "JobPlan", "ProviderError", "job_plan", "resolve_run_plan"]),
        ("trainyard.workflows", ["Workflow", "ResourceSpec", "WorkflowFileError", "load_workflows_file"]),
    ],
)
def test_the_old_import_paths_give_the_same_objects_with_a_deprecation_warning(
    module: str, names: list[str], monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.delitem(sys.modules, module, raising=False)
    with pytest.warns(DeprecationWarning, match=f"^{module} is deprecated: import .* from trainyard_spec$"):
        old = importlib.import_module(module)
    assert [getattr(old, name) for name in names] == [getattr(trainyard_spec, name) for name in names]
