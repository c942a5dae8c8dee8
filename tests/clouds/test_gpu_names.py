"""GPU requests mean what they say (issue 33): a name matches a GPU's exact
model, case-insensitive, or through an alias the models table beside the AWS
catalog declares; never by substring. One rule (``gpus.gpu_matches``, used by
``shortfall`` and ``gpu_shortfall``) for a catalog's offers, a backend's shapes
and the names ``nvidia-smi`` reports on a machine."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

import pytest

from backend.accounts.models import Workspace
from backend.clouds.backends.aws.catalog import CATALOG_DIR, load_catalog
from backend.clouds.backends.aws.compute import AwsCompute
from backend.clouds.backends.base import AccountConfig, Gpu, Requirements, gpu_shortfall, shortfall
from backend.clouds.backends.gpus import MODELS_FILE, aliases, gpu_matches, gpu_model, models
from backend.clouds.backends.local.host import parse_nvidia_smi
from backend.clouds.models import CloudAccount
from backend.clouds.services.offers import offer_requirements
from backend.runs.services.offerplan import offer_plan
from tests.support.fixtures import Person

GIB = 2**30
WS = "/api/v1/workspaces/acme"
# What `nvidia-smi --query-gpu=name,memory.total --format=csv,noheader,nounits` prints on these machines.
NVIDIA_SMI = {
    "g6e": "NVIDIA L40S, 46068",
    "g6": "NVIDIA L4, 23034",
    "g5": "NVIDIA A10G, 23028",
    "g4dn": "Tesla T4, 15360",
    "p3": "Tesla V100-SXM2-16GB, 16384",
    "p4d": "NVIDIA A100-SXM4-40GB, 40960",
    "p4de": "NVIDIA A100-SXM4-80GB, 81920",
    "a100-pcie": "NVIDIA A100 80GB PCIe, 81920",
    "p5": "NVIDIA H100 80GB HBM3, 81559",
}


def aws(tmp_path: Path | None = None, rows: list[dict[str, Any]] | None = None) -> AwsCompute:
    """The aws backend on the shipped catalog (or on ``rows``): offers need no network call."""
    config: dict[str, Any] = {"regions": ["us-east-1"]}
    if rows is not None and tmp_path is not None:
        path = tmp_path / "aws.csv"
        with path.open("w", newline="") as file:
            writer = csv.DictWriter(file, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
        config["catalog_file"] = str(path)
    account = AccountConfig(
        account_id="a", workspace_id="w", kind="aws", installation="i", config=config,
        credentials={"access_key_id": "testing", "secret_access_key": "testing"},
    )  # fmt: skip
    return AwsCompute(account)


def fitting(compute: AwsCompute, gpu: str) -> set[tuple[str, str]]:
    req = offer_requirements(gpu=gpu)
    return {(o.instance_type, o.gpus[0].name) for o in compute.offers(req) if shortfall(req, o) is None}


def test_gpu_l4_never_offers_an_l40s_from_the_shipped_catalog() -> None:
    offered = fitting(aws(), "L4")

    assert offered and {model for _, model in offered} == {"L4"}
    assert {kind.split(".")[0] for kind, _ in offered} == {"g6"}  # no g6e (L40S), at about twice the price


@pytest.mark.parametrize(
    ("gpu", "family", "model"),
    [
        ("A10", None, None),  # neither the A100 (p4d) nor the A10G (g5)
        ("A10G", "g5", "A10G"),
        ("a10g", "g5", "A10G"),
        ("L40S", "g6e", "L40S"),
        ("A100", "p4d", "A100-40GB"),  # gpuhunt's A100 of 40 GB, named by its exact model
        ("A100-40GB", "p4d", "A100-40GB"),
        ("A100-80GB", None, None),
        ("V100", "p3", "V100-16GB"),
        ("H100:8", "p5", "H100-80GB"),
        ("T4:4", "g4dn", "T4"),
    ],
)
def test_the_shipped_catalog_offers_exactly_the_model_named(gpu: str, family: str | None, model: str | None) -> None:
    offered = fitting(aws(), gpu)

    assert {kind.split(".")[0] for kind, _ in offered} == ({family} if family else set())
    assert {name for _, name in offered} == ({model} if model else set())


def test_an_alias_the_catalog_declares_matches_each_of_its_models(tmp_path: Path) -> None:
    """A gpuhunt catalog with both A100s (p4d of 40 GB, p4de of 80 GB)."""
    row = {"location": "us-east-1", "cpu": 96, "memory": 1152, "gpu_count": 8, "gpu_name": "A100", "spot": "False"}
    rows = [
        {**row, "instance_name": "p4d.24xlarge", "price": 32.77, "gpu_memory": 40},
        {**row, "instance_name": "p4de.24xlarge", "price": 40.96, "gpu_memory": 80},
    ]
    compute = aws(tmp_path, rows)

    assert aliases()["A100"] == ("A100-40GB", "A100-80GB")
    assert fitting(compute, "A100:8") == {("p4d.24xlarge", "A100-40GB"), ("p4de.24xlarge", "A100-80GB")}
    assert fitting(compute, "a100-80gb:8") == {("p4de.24xlarge", "A100-80GB")}
    assert fitting(compute, "A100-40GB:8") == {("p4d.24xlarge", "A100-40GB")}


def test_every_declared_model_and_alias_is_one_the_shipped_catalog_or_nvidia_smi_names() -> None:
    """The table is small and meant: each alias is a family the catalog lists by that name."""
    catalog = {g.name for row in load_catalog() for g in row.gpus}
    assert MODELS_FILE.parent == CATALOG_DIR  # beside aws.csv
    for model, row in models().items():
        assert model.startswith(f"{row.alias}-") and model.endswith(f"-{row.memory_gib}GB")
    assert {"A100-40GB", "H100-80GB", "V100-16GB"} <= catalog
    assert not {g for g in catalog if g in aliases()}  # the catalog names models, the aliases stand for them


@pytest.mark.parametrize(
    ("machine", "model"),
    [
        ("g6e", "L40S"),
        ("g6", "L4"),
        ("g5", "A10G"),
        ("g4dn", "T4"),
        ("p3", "V100-16GB"),
        ("p4d", "A100-40GB"),
        ("p4de", "A100-80GB"),
        ("a100-pcie", "A100-80GB"),
        ("p5", "H100-80GB"),
    ],
)
def test_nvidia_smi_names_reduce_to_the_catalogs_models(machine: str, model: str) -> None:
    (gpu,) = parse_nvidia_smi(NVIDIA_SMI[machine])

    assert gpu.model == gpu_model(gpu.name, gpu.memory_bytes) == model


@pytest.mark.parametrize(
    ("requested", "machine", "matches"),
    [
        ("L4", "g6e", False),
        ("L4", "g6", True),
        ("l4", "g6", True),
        ("A10", "p4d", False),
        ("A10", "g5", False),
        ("A10G", "g5", True),
        ("A100", "p4d", True),
        ("A100", "p4de", True),
        ("A100", "a100-pcie", True),
        ("A100-80GB", "p4d", False),
        ("A100-80GB", "p4de", True),
        ("A100-40GB", "p4de", False),
        ("V100", "p3", True),
        ("H100", "p5", True),
        ("T4", "g4dn", True),
        ("NVIDIA L4", "g6", True),
        ("", "g6e", True),  # no name: any GPU
    ],
)
def test_an_idle_machines_reported_gpus_match_by_the_same_rule(requested: str, machine: str, matches: bool) -> None:
    gpus = parse_nvidia_smi(NVIDIA_SMI[machine])
    req = Requirements(gpu_count=1, gpu_name=requested)

    assert gpu_matches(requested, gpus[0].name, gpus[0].memory_bytes) is matches
    assert (gpu_shortfall(req, gpus) is None) is matches


def test_a_shortfall_names_what_the_machine_has() -> None:
    l40s = parse_nvidia_smi(NVIDIA_SMI["g6e"])

    assert gpu_shortfall(Requirements(gpu_count=1, gpu_name="L4"), l40s) == (
        "1× L4 requested, this machine has NVIDIA L40S"
    )


@pytest.mark.parametrize(
    ("gpu", "count"),
    [("A100:2", 2), ("A100", 1), (" L4:8 ", 8)],
)
def test_offers_read_name_colon_count_as_workflows_do(gpu: str, count: int) -> None:
    req = offer_requirements(gpu=gpu)

    assert (req.gpu_name, req.gpu_count) == (gpu.strip().partition(":")[0], count)


# ---------------------------------------------------------------- the plan and the offers API


def fake_account(workspace: Workspace, tmp_path: Path, offers: list[dict[str, Any]]) -> CloudAccount:
    config = {"state_dir": str(tmp_path / workspace.slug), "offers": offers}
    return CloudAccount.objects.create(workspace=workspace, kind="fake", name="fake", config=config)


L4 = {"name": "NVIDIA L4", "memory_bytes": 24 * GIB}
L40S = {"name": "NVIDIA L40S", "memory_bytes": 48 * GIB}
OFFERS = [
    {"instance_type": "g6e.xlarge", "cpus": 4, "memory_bytes": 32 * GIB, "price_per_hour": 0.5, "gpus": [L40S]},
    {"instance_type": "g6.xlarge", "cpus": 4, "memory_bytes": 16 * GIB, "price_per_hour": 0.8, "gpus": [L4]},
    {"instance_type": "g6.12xlarge", "cpus": 48, "memory_bytes": 192 * GIB, "price_per_hour": 4.6, "gpus": [L4] * 4},
]


@pytest.mark.django_db
def test_offers_for_an_l4_never_list_an_l40s_even_a_cheaper_one(
    team: Workspace, owner: Person, tmp_path: Path, settings: Any
) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "LOCAL_BACKEND_ENABLED": False}
    fake_account(team, tmp_path, OFFERS)
    client = owner.client()

    one = client.get(f"{WS}/offers/?gpu=L4").json()
    four = client.get(f"{WS}/offers/?gpu=L4:4").json()

    assert [o["instance_type"] for o in one["offers"]] == ["g6.xlarge", "g6.12xlarge"]
    assert [o["instance_type"] for o in four["offers"]] == ["g6.12xlarge"]


@pytest.mark.django_db
def test_the_plan_shows_the_exact_model_of_the_offer_chosen(team: Workspace, tmp_path: Path, settings: Any) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "LOCAL_BACKEND_ENABLED": False}
    fake_account(team, tmp_path, OFFERS)

    plan = offer_plan(workspace_id=team.pk, resources={"gpu_count": 1, "gpu_name": "l4"}, placement={})
    none = offer_plan(workspace_id=team.pk, resources={"gpu_count": 1, "gpu_name": "A10"}, placement={})

    assert (plan["instance_type"], plan["gpus"]) == (
        "g6.xlarge",
        [{"model": "L4", "count": 1, "memory_bytes": 24 * GIB}],
    )
    assert none["offers"] == 0 and none["reason"].startswith("fake g6.12xlarge: 1× A10 requested, this machine has")


def test_the_plan_names_a_catalog_family_by_its_model() -> None:
    assert Gpu("A100", 40 * GIB).model == "A100-40GB"
    assert Gpu("A100", 80 * GIB).model == "A100-80GB"
    assert Gpu("A100", 0).model == "A100"  # memory unknown: the family, as written
    assert Gpu("nvidia l40s", 48 * GIB).model == "L40S"
