"""The backends, setup, offers and instances endpoints: roles, tenancy, and
credentials that never come back (asserted on the raw JSON)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from rest_framework.test import APIClient

from backend.accounts.models import Workspace
from backend.clouds.models import CloudAccount, Instance, InstanceStatus
from backend.vault.crypto import encrypt
from tests.support.aws_account import BUCKET, iam_user, main_route_table, prepare
from tests.support.fixtures import Person
from tests.support.moto import MotoServer

WS = "/api/v1/workspaces/acme"
SECRET = "wJalrXUtnFEMI-very-secret-value"


def keys_body(**extra: Any) -> dict[str, Any]:
    body = {
        "kind": "aws",
        "access_key_id": "AKIAIOSFODNN7EXAMPLE",
        "secret_access_key": SECRET,
        "regions": ["us-east-1"],
        "bucket": BUCKET,
    }
    return {**body, **extra}


def connected(aws: MotoServer, owner: Person) -> dict[str, Any]:
    prepare(aws, regions=["us-east-1"])
    response = owner.client().post(f"{WS}/backends/", keys_body(), format="json")
    assert response.status_code == 201, response.content
    return dict(response.json())


def test_connect_with_keys_then_list_show_validate_and_remove(aws: MotoServer, owner: Person, settings: Any) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "LOCAL_BACKEND_ENABLED": False}
    client = owner.client()

    created = connected(aws, owner)

    assert {k: created[k] for k in ("name", "kind", "status", "auth", "regions", "bucket", "live_instances")} == {
        "name": "aws",
        "kind": "aws",
        "status": "active",
        "auth": "keys",
        "regions": ["us-east-1"],
        "bucket": BUCKET,
        "live_instances": 0,
    }
    assert created["aws_account_id"] == "123456789012"
    assert [b["name"] for b in client.get(f"{WS}/backends/").json()] == ["aws"]
    assert client.get(f"{WS}/backends/aws/").json()["status"] == "active"
    assert client.post(f"{WS}/backends/aws/validate/").json()["status"] == "active"
    assert client.delete(f"{WS}/backends/aws/").status_code == 204
    assert client.get(f"{WS}/backends/aws/").status_code == 404


def test_credentials_never_appear_in_any_answer(aws: MotoServer, owner: Person) -> None:
    connected(aws, owner)
    client = owner.client()

    answers = [
        client.get(f"{WS}/backends/"),
        client.get(f"{WS}/backends/aws/"),
        client.post(f"{WS}/backends/aws/validate/"),
        client.get(f"{WS}/backends/aws/setup/"),
        client.get(f"{WS}/instances/?all=1"),
        client.get(f"{WS}/offers/"),
    ]

    for answer in answers:
        assert answer.status_code == 200, answer.content
        assert SECRET.encode() not in answer.content
        assert b"secret_access_key" not in answer.content
        assert b"AKIAIOSFODNN7EXAMPLE" not in answer.content
        assert b"credentials" not in answer.content
    schema = client.get("/api/v1/schema/?format=json").json()["components"]["schemas"]
    assert "secret_access_key" not in schema["BackendOut"]["properties"]
    assert "access_key_id" not in schema["BackendOut"]["properties"]


def test_a_failed_connect_answers_the_checks_message_and_saves_nothing(aws: MotoServer, owner: Person) -> None:
    prepare(aws, regions=["us-east-1"], bucket=None)

    response = owner.client().post(f"{WS}/backends/", keys_body(), format="json")

    assert response.status_code == 400
    assert response.json()["message"].startswith("bucket my-artifacts does not exist (NoSuchBucket)")
    assert response.json()["extra"] == {"code": "NoSuchBucket"}
    assert not CloudAccount.objects.filter(kind="aws").exists()


def test_a_missing_field_is_named(owner: Person) -> None:
    body = keys_body()
    del body["bucket"]

    response = owner.client().post(f"{WS}/backends/", body, format="json")

    assert response.status_code == 400
    assert response.json()["message"] == "Invalid input: bucket: This field is required."


def test_validate_answers_the_reason_and_the_list_shows_the_account_broken(aws: MotoServer, owner: Person) -> None:
    connected(aws, owner)
    from tests.support.aws_account import admin

    admin(aws, "ec2").delete_route(RouteTableId=main_route_table(aws, "us-east-1"), DestinationCidrBlock="0.0.0.0/0")
    client = owner.client()

    response = client.post(f"{WS}/backends/aws/validate/")

    assert response.status_code == 400
    shown = client.get(f"{WS}/backends/aws/").json()
    assert shown["status"] == "broken"
    assert shown["status_reason"] == response.json()["message"]
    assert "has no route to the internet" in shown["status_reason"]


def test_remove_is_refused_with_the_live_instances_named(aws: MotoServer, owner: Person) -> None:
    connected(aws, owner)
    account = CloudAccount.objects.get(name="aws")
    Instance.objects.create(
        workspace=account.workspace, account=account, backend="aws", name="aws-5e6f", token_hash="t1"
    )

    response = owner.client().delete(f"{WS}/backends/aws/")

    assert response.status_code == 409
    assert response.json()["message"].startswith("Backend 'aws' still has 1 live instance(s): aws-5e6f (provisioning).")
    assert owner.client().get(f"{WS}/backends/aws/").json()["live_instances"] == 1


def test_setup_returns_the_external_id_and_both_policies(owner: Person, settings: Any) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "AWS_PRINCIPAL_ARN": "arn:aws:iam::111122223333:role/ty-server"}

    first = owner.client().get(f"{WS}/backends/aws/setup/?bucket=my-artifacts").json()
    again = owner.client().get(f"{WS}/backends/aws/setup/").json()

    assert first["external_id"] == again["external_id"]
    assert first["principal"] == "arn:aws:iam::111122223333:role/ty-server"
    assert first["trust_policy"]["Statement"][0]["Condition"]["StringEquals"]["sts:ExternalId"] == first["external_id"]
    assert "arn:aws:s3:::my-artifacts/trainyard/*" in json.dumps(first["permission_policy"])
    assert "arn:aws:s3:::${BucketName}/trainyard/*" in json.dumps(again["permission_policy"])
    sids = {st["Sid"] for st in again["permission_policy"]["Statement"]}
    assert not sids & {"ReadNamedDataBuckets", "ReadNamedDataObjects", "WriteOutputsToNamedBuckets"}


def test_setup_adds_the_statements_of_the_named_data_and_output_buckets(owner: Person) -> None:
    query = "bucket=my-artifacts&data_bucket=acme-data&output_bucket=acme-models-*"
    setup = owner.client().get(f"{WS}/backends/aws/setup/?{query}").json()

    by_sid = {st["Sid"]: st for st in setup["permission_policy"]["Statement"]}
    assert by_sid["ReadNamedDataBuckets"]["Resource"] == ["arn:aws:s3:::acme-data"]
    assert by_sid["ReadNamedDataObjects"]["Resource"] == ["arn:aws:s3:::acme-data/*"]
    assert by_sid["WriteOutputsToNamedBuckets"]["Resource"] == ["arn:aws:s3:::acme-models-*/*"]
    assert "${" not in json.dumps(setup["permission_policy"])


# ------------------------------------------------------------------ tenancy


def test_another_workspace_sees_nothing_of_the_account(aws: MotoServer, owner: Person, outsider: Person) -> None:
    connected(aws, owner)
    account = CloudAccount.objects.get(name="aws")
    Instance.objects.create(
        workspace=account.workspace, account=account, backend="aws", name="aws-7a8b", token_hash="t2"
    )
    own = f"/api/v1/workspaces/{outsider.user.personal_workspace.slug}"
    client = outsider.client()

    for path in ("backends/", "backends/aws/", "backends/aws/setup/", "instances/", "offers/"):
        assert client.get(f"{WS}/{path}").status_code == 404, path
    assert client.post(f"{WS}/backends/aws/validate/").status_code == 404
    assert client.delete(f"{WS}/backends/aws/").status_code == 404
    assert [b["name"] for b in client.get(f"{own}/backends/").json() if b["kind"] == "aws"] == []
    assert client.get(f"{own}/backends/aws/").status_code == 404
    assert client.post(f"{own}/backends/aws/validate/").status_code == 404
    assert client.delete(f"{own}/backends/aws/").status_code == 404
    assert client.get(f"{own}/instances/?all=1").json() == []
    assert (
        client.get(f"{own}/backends/aws/setup/").json()["external_id"]
        != (owner.client().get(f"{WS}/backends/aws/setup/").json()["external_id"])
    )
    assert CloudAccount.objects.filter(name="aws").count() == 1


def fake_account(workspace: Workspace, tmp_path: Path, offers: list[dict[str, Any]]) -> CloudAccount:
    config = {"state_dir": str(tmp_path / workspace.slug), "offers": offers}
    return CloudAccount.objects.create(workspace=workspace, kind="fake", name="fake", config=config)


GIB = 2**30
A10G = {"name": "NVIDIA A10G", "memory_bytes": 24 * GIB}
OFFERS = [
    {"instance_type": "g5.2xlarge", "cpus": 8, "memory_bytes": 32 * GIB, "price_per_hour": 1.212, "gpus": [A10G]},
    {"instance_type": "g5.xlarge", "cpus": 4, "memory_bytes": 16 * GIB, "price_per_hour": 1.006, "gpus": [A10G]},
    {
        "instance_type": "g5.xlarge",
        "cpus": 4,
        "memory_bytes": 16 * GIB,
        "price_per_hour": 0.35,
        "gpus": [A10G],
        "spot": True,
        "region": "fake-region-2",
    },
    {"instance_type": "m5.large", "cpus": 2, "memory_bytes": 8 * GIB, "price_per_hour": 0.096},
]


def test_offers_are_the_workspaces_own_cheapest_first_and_filtered(
    team: Workspace, owner: Person, outsider: Person, tmp_path: Path, settings: Any
) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "LOCAL_BACKEND_ENABLED": False}
    fake_account(team, tmp_path, OFFERS)
    client = owner.client()

    every = client.get(f"{WS}/offers/?gpu=A10G&memory=16GB").json()
    on_demand = client.get(f"{WS}/offers/?gpu=A10G&spot_policy=on-demand").json()
    regional = client.get(f"{WS}/offers/?gpu=a10g&region=fake-region-2").json()
    bigger = client.get(f"{WS}/offers/?gpu=A10G&memory=20GB&cpu=8").json()

    assert [(o["instance_type"], o["spot"], o["price_per_hour"]) for o in every["offers"]] == [
        ("g5.xlarge", True, 0.35),
        ("g5.xlarge", False, 1.006),
        ("g5.2xlarge", False, 1.212),
    ]
    first = every["offers"][0]
    assert {k: first[k] for k in ("backend", "account", "region", "zone", "cpus", "memory_bytes", "catalog_date")} == {
        "backend": "fake",
        "account": "fake",
        "region": "fake-region-2",
        "zone": "fake-region-2a",
        "cpus": 4,
        "memory_bytes": 16 * GIB,
        "catalog_date": None,
    }
    assert first["gpus"] == [A10G]
    assert [o["price_per_hour"] for o in on_demand["offers"]] == [1.006, 1.212]
    assert [o["price_per_hour"] for o in regional["offers"]] == [0.35]
    assert [o["instance_type"] for o in bigger["offers"]] == ["g5.2xlarge"]
    # The outsider's workspace has no account: no offer of ours shows up there.
    own = f"/api/v1/workspaces/{outsider.user.personal_workspace.slug}"
    assert outsider.client().get(f"{own}/offers/?gpu=A10G").json() == {"offers": [], "shortfall": "", "accounts": 0}


def test_offers_with_nothing_fitting_say_why(team: Workspace, owner: Person, tmp_path: Path, settings: Any) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "LOCAL_BACKEND_ENABLED": False}
    fake_account(team, tmp_path, OFFERS)

    answer = owner.client().get(f"{WS}/offers/?gpu=H100").json()

    assert answer["offers"] == []
    assert answer["shortfall"].startswith("fake g5.2xlarge: 1× H100 requested, this machine has NVIDIA A10G")


@pytest.mark.parametrize(
    ("query", "message"),
    [
        ("memory=16", "memory '16': expected a size such as 512MB or 16GB"),
        ("gpu=A10G:x", "gpu 'A10G:x': write a name and an optional count"),
        ("spot_policy=maybe", "spot_policy 'maybe': one of spot, on-demand, auto"),
        ("cpu=lots", "cpu 'lots': a whole number of CPUs"),
    ],
)
def test_bad_offer_filters_are_named(query: str, message: str, owner: Person) -> None:
    response = owner.client().get(f"{WS}/offers/?{query}")

    assert response.status_code == 400
    assert response.json()["message"].startswith(message)


def test_instances_show_type_region_market_price_and_the_clouds_id(team: Workspace, owner: Person) -> None:
    account = CloudAccount.objects.create(workspace=team, kind="aws", name="aws", config={"regions": ["us-east-1"]})
    Instance.objects.create(
        workspace=team,
        account=account,
        backend="aws",
        backend_id="i-0123456789abcdef0",
        name="aws-9c0d",
        token_hash="t3",
        instance_type="g5.xlarge",
        region="us-east-1",
        zone="us-east-1b",
        spot=True,
        price_per_hour="0.412300",
        status=InstanceStatus.IDLE,
    )

    [shown] = owner.client().get(f"{WS}/instances/").json()

    assert {
        k: shown[k]
        for k in (
            "name",
            "backend",
            "account",
            "backend_id",
            "instance_type",
            "region",
            "zone",
            "spot",
            "price_per_hour",
        )
    } == {
        "name": "aws-9c0d",
        "backend": "aws",
        "account": "aws",
        "backend_id": "i-0123456789abcdef0",
        "instance_type": "g5.xlarge",
        "region": "us-east-1",
        "zone": "us-east-1b",
        "spot": True,
        "price_per_hour": 0.4123,
    }
    assert shown["uptime_seconds"] >= 0 and shown["current_job"] is None


# ------------------------------------------------------------------ roles


def _endpoints() -> dict[str, tuple[str, str, Any]]:
    return {
        "list": ("get", f"{WS}/backends/", None),
        "setup": ("get", f"{WS}/backends/aws/setup/", None),
        "detail": ("get", f"{WS}/backends/aws/", None),
        "offers": ("get", f"{WS}/offers/", None),
        "create": ("post", f"{WS}/backends/", keys_body(name="aws-eu")),
        "validate": ("post", f"{WS}/backends/aws/validate/", None),
        "remove": ("delete", f"{WS}/backends/aws/", None),
    }


READ_OK = {"list": 200, "setup": 200, "detail": 200, "offers": 200}
ADMIN_OK = {"create": 201, "validate": 200, "remove": 204}


def _state(team: Workspace) -> list[tuple[str, str, str]]:
    # Reading offers makes the shared local account appear: that is not a change by the caller.
    accounts = CloudAccount.objects.for_workspace(team).exclude(kind="local")
    return sorted(accounts.values_list("name", "status", "status_reason"))


@pytest.mark.parametrize("endpoint", [*READ_OK, *ADMIN_OK])
@pytest.mark.parametrize("who", ["anonymous", "outsider", "viewer", "member", "owner"])
def test_backend_endpoints_by_role(
    who: str,
    endpoint: str,
    aws: MotoServer,
    team: Workspace,
    owner: Person,
    member: Person,
    viewer: Person,
    outsider: Person,
    request: pytest.FixtureRequest,
) -> None:
    if endpoint in ("create", "validate"):
        prepare(aws, regions=["us-east-1"])
    credentials = encrypt(json.dumps({"access_key_id": "AKIATEST", "secret_access_key": SECRET}))
    CloudAccount.objects.create(
        workspace=team,
        kind="aws",
        name="aws",
        config={"regions": ["us-east-1"], "bucket": BUCKET, "prefix": "trainyard/"},
        credentials_ciphertext=credentials,
        status="broken",
        status_reason="made broken by the test",
    )
    client = APIClient() if who == "anonymous" else request.getfixturevalue(who).client()
    method, url, body = _endpoints()[endpoint]
    before = _state(team)

    status = getattr(client, method)(url, body, format="json").status_code

    expected = {**READ_OK, **ADMIN_OK}[endpoint]
    if who == "anonymous":
        expected = 401
    elif who == "outsider":
        expected = 404
    elif who in ("viewer", "member") and endpoint in ADMIN_OK:
        expected = 403
    assert status == expected
    if status >= 400 or endpoint in READ_OK:
        assert _state(team) == before


def test_iam_user_keys_connect_through_the_api_with_moto_checking_every_call(aws: MotoServer, owner: Person) -> None:
    prepare(aws, regions=["us-east-1"])
    key, secret = iam_user(aws, "api-user")

    with aws.iam_auth():
        response = owner.client().post(
            f"{WS}/backends/", keys_body(access_key_id=key, secret_access_key=secret), format="json"
        )

    assert response.status_code == 201, response.content
    assert secret.encode() not in response.content
