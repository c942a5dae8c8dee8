"""Backends are built per account from their kind, and stay plain Python."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from backend.clouds.backends.aws.compute import AwsCompute
from backend.clouds.backends.base import AccountConfig
from backend.clouds.backends.errors import InvalidConfig
from backend.clouds.backends.fake.compute import FakeCompute
from backend.clouds.backends.kubernetes.compute import KubernetesCompute
from backend.clouds.backends.local.compute import LocalCompute
from backend.clouds.backends.registry import KINDS, compute_class, compute_for
from tests.clouds.subjects import kubeconfig_text

REPO = Path(__file__).resolve().parents[2]


def _account(kind: str, credentials: dict[str, str] | None = None, **config: object) -> AccountConfig:
    return AccountConfig(
        account_id="a",
        workspace_id="w",
        kind=kind,
        installation="ty-test",
        config=config,
        credentials=credentials or {},
    )


def test_each_kind_builds_its_backend_for_the_account(tmp_path: Path) -> None:
    local = compute_for(_account("local", runners_dir=str(tmp_path / "runners")))
    fake = compute_for(_account("fake", state_dir=str(tmp_path / "fake")))
    keys = {"access_key_id": "AKIAEXAMPLE", "secret_access_key": "secret"}
    aws = compute_for(_account("aws", keys, regions=["us-east-1"]))  # builds without calling AWS
    kubeconfig = {"kubeconfig": kubeconfig_text("https://k8s.example.com", "token")}
    kube = compute_for(_account("kubernetes", kubeconfig, namespace="ml"))  # builds without calling the cluster

    assert (type(local), type(fake), type(aws)) == (LocalCompute, FakeCompute, AwsCompute)
    assert type(kube) is KubernetesCompute
    assert local.account.installation == "ty-test"
    assert sorted(KINDS) == ["aws", "fake", "kubernetes", "local", "self-hosted"]


def test_the_capabilities_and_timings_are_declared_on_the_class() -> None:
    local, fake = compute_class("local"), compute_class("fake")

    assert (local.kind, local.reusable_instances, local.supports_spot, local.timings.provision_timeout) == (
        "local",
        True,
        False,
        60.0,
    )
    assert (fake.kind, fake.reusable_instances, fake.supports_spot) == ("fake", True, True)


def test_an_unknown_kind_names_the_known_ones() -> None:
    with pytest.raises(InvalidConfig) as raised:
        compute_for(_account("gcp"))

    assert raised.value.message == "unknown backend kind 'gcp'; known kinds: aws, fake, kubernetes, local, self-hosted"
    assert raised.value.code == "UnknownBackendKind"


def test_extra_kinds_are_added_by_import_string(tmp_path: Path) -> None:
    extra = {"fake2": "tests.clouds.test_registry:Fake2"}

    built = compute_for(_account("fake2", state_dir=str(tmp_path)), extra)

    assert (type(built).__name__, built.kind) == ("Fake2", "fake2")  # the module may be imported twice
    with pytest.raises(InvalidConfig, match="known kinds: aws, fake, fake2, kubernetes, local, self-hosted"):
        compute_class("nope", extra)


def test_an_import_string_that_is_not_a_backend_of_that_kind_is_a_type_error() -> None:
    with pytest.raises(TypeError) as raised:
        compute_class("local", {"local": "backend.clouds.backends.fake.compute:FakeCompute"})

    assert (
        str(raised.value) == "backend.clouds.backends.fake.compute:FakeCompute is not a Compute class with kind 'local'"
    )


def test_the_backends_import_no_django_no_runs_and_only_the_runners_protocol() -> None:
    script = (
        "import json, sys\n"
        "import backend.clouds.backends.registry, backend.clouds.backends.local.compute,"
        " backend.clouds.backends.fake.compute, backend.clouds.backends.aws.compute,"
        " backend.clouds.backends.kubernetes.compute, backend.clouds.backends.kubernetes.checks\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in ('django', 'trainyard_runner')"
        " or m.startswith('backend.runs'))))\n"
    )

    imported = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    ).stdout

    assert set(json.loads(imported)) <= {"trainyard_runner", "trainyard_runner.protocol"}


class Fake2(FakeCompute):
    kind = "fake2"
