"""Account facts are asked for by a periodic task and stored on the account,
so offers (and scheduling) never wait on a cloud: AWS on moto over HTTP."""

from __future__ import annotations

import json
from typing import Any

import boto3

from backend.accounts.models import Workspace
from backend.clouds.backends.base import Requirements
from backend.clouds.models import CloudAccount
from backend.clouds.services.accounts import compute_of
from backend.clouds.services.facts import accounts_refresh_facts
from backend.vault.crypto import encrypt
from tests.support.accounttasks import run_account_tasks
from tests.support.moto import MotoServer


def _account(team: Workspace) -> CloudAccount:
    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket="ty-facts")
    return CloudAccount.objects.create(
        workspace=team,
        kind="aws",
        name="aws",
        config={"regions": ["us-east-1"], "bucket": "ty-facts"},
        credentials_ciphertext=encrypt(json.dumps({"access_key_id": "testing", "secret_access_key": "testing"})),
    )


def test_facts_are_stored_on_the_account_and_split_its_offers_by_zone(aws: MotoServer, team: Workspace) -> None:
    account = _account(team)
    assert {o.zone for o in compute_of(account).offers(Requirements())} == {""}, "no facts yet: per region"

    assert accounts_refresh_facts() == 1

    account.refresh_from_db()
    facts: dict[str, Any] = account.config["facts"]
    assert set(facts["regions"]) == {"us-east-1"} and facts["regions"]["us-east-1"]["zones"]
    zones = {o.zone for o in compute_of(account).offers(Requirements()) if o.instance_type == "m6i.large"}
    assert zones and "" not in zones and zones <= set(facts["regions"]["us-east-1"]["zones"])
    assert account.config["bucket"] == "ty-facts", "the rest of the config is kept"


def test_fresh_facts_are_not_asked_for_again_until_they_are_old(
    aws: MotoServer, team: Workspace, settings: Any
) -> None:
    account = _account(team)
    accounts_refresh_facts()
    assert accounts_refresh_facts() == 0, "fresh: no AWS call"
    assert accounts_refresh_facts(account_id=str(account.pk)) == 1, "asked for one account: at once"

    settings.TRAINYARD = {**settings.TRAINYARD, "FACTS_REFRESH_SECONDS": 0.0}
    assert accounts_refresh_facts() == 1


def test_an_account_whose_credentials_are_refused_is_marked_broken(aws: MotoServer, team: Workspace) -> None:
    account = _account(team)
    with aws.iam_auth():  # moto checks keys: "testing" is no IAM user's
        assert accounts_refresh_facts() == 0

    account.refresh_from_db()
    assert account.status == "broken" and account.status_reason


def test_refused_credentials_while_watching_machines_mark_the_account_broken(
    aws: MotoServer, team: Workspace, settings: Any
) -> None:
    """Not only a launch: the leak sweep's and describe's calls too."""
    settings.TRAINYARD = {**settings.TRAINYARD, "LEAK_SWEEP_SECONDS": 0.0}
    account = _account(team)
    from backend.clouds.services.reconcile import clouds_reconcile

    with aws.iam_auth():
        clouds_reconcile()
        run_account_tasks()

    account.refresh_from_db()
    assert account.status == "broken"
    assert "AWS" in account.status_reason or "credentials" in account.status_reason.lower(), account.status_reason
