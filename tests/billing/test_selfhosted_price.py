"""A self-hosted machine costs what the workspace says: a price per hour
given with its registration token (the machine is priced from its first
hello) or set by an admin afterwards (API and ``trainyard runner price``),
audited, shown with the machine and used by every cost read from then on."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from backend.accounts.models import AuditEvent, Membership, Role, Workspace
from backend.clouds.models import Instance, RunnerRegistrationToken
from backend.clouds.services.instances import Facts, instance_connected
from backend.runs.models import Attempt
from backend.runs.scheduler.passes import jobs_schedule
from tests.support.attempts import accept, report
from tests.support.cli_wsgi import cli_as, cli_invoke, in_the_tests_transaction
from tests.support.fixtures import Person, submit

GIB = 2**30
BASE = "/api/v1/workspaces/acme"
TOKENS = f"{BASE}/runners/registration-tokens/"


@pytest.fixture(autouse=True)
def no_local_backend(settings: Any) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "LOCAL_BACKEND_ENABLED": False}


def registered(owner: Person, price: str | None = None, name: str = "lab-box") -> Instance:
    """A machine registered as ``trainyard-runner register`` does, its runner connected."""
    body = {"note": "lab box", **({"price_per_hour": price} if price is not None else {})}
    token = owner.client().post(TOKENS, body, format="json")
    assert token.status_code == 201, token.json()
    answer = APIClient().post("/api/v1/runner/register/", {"token": token.json()["token"], "name": name}, format="json")
    assert answer.status_code == 201, answer.json()
    machine = Instance.objects.get(pk=answer.json()["runner"])
    facts = Facts(name, "10.0.0.9", "test", 8, 32 * GIB, 500 * GIB, [])
    assert instance_connected(instance_id=str(machine.pk), channel_name="c", facts=facts, busy=False)
    return machine


def ran_half_an_hour(team: Workspace, owner: Person, machine: Instance) -> str:
    """A job that held ``machine`` 1800 s of its 1830 s; the run's name."""
    run = submit(team, owner.user)
    job = run.jobs.get()
    jobs_schedule()
    assert accept(job, machine.pk)
    assert report(job, machine.pk, "succeeded", 0)
    start = timezone.now() - timedelta(hours=1)
    Instance.objects.filter(pk=machine.pk).update(running_at=start, terminated_at=start + timedelta(seconds=1830))
    Attempt.objects.filter(job=job).update(
        started_at=start + timedelta(seconds=10), finished_at=start + timedelta(seconds=1810)
    )
    return run.name


def test_a_machine_registered_with_a_price_costs_it_from_its_first_hello(
    team: Workspace, owner: Person, member: Person
) -> None:
    machine = registered(owner, price="1.20")
    run = ran_half_an_hour(team, owner, machine)

    listed = member.client().get(f"{BASE}/runners/").json()
    assert [(r["name"], r["price_per_hour"], r["price_source"]) for r in listed] == [
        ("lab-box", "1.200000", "workspace price for self-hosted")
    ]
    page = member.client().get(f"{BASE}/runs/{run}/").json()
    (attempt,) = page["jobs"][0]["attempts"]
    assert (attempt["price_per_hour"], attempt["billed_seconds"], attempt["cost"]) == ("1.200000", 1800, "0.6000")
    report_ = member.client().get(f"{BASE}/costs/", {"since": "2d", "by": "backend"}).json()
    # 1800 s x $1.20/h = $0.60; the 30 s it waited idle = $0.01 on the idle line.
    assert report_["rows"] == [{"key": "self-hosted", "cost": "0.6000"}]
    assert report_["idle"] == "0.0100"


def test_an_admin_sets_the_price_of_a_registered_machine_audited(
    team: Workspace, owner: Person, member: Person
) -> None:
    machine = registered(owner)
    run = ran_half_an_hour(team, owner, machine)
    assert member.client().get(f"{BASE}/runs/{run}/").json()["cost"] == "0.0000"  # free until priced

    answer = owner.client().patch(f"{BASE}/runners/{machine.pk}/", {"price_per_hour": "2.40"}, format="json")

    assert answer.status_code == 200, answer.json()
    assert (answer.json()["price_per_hour"], answer.json()["price_source"]) == (
        "2.400000",
        "workspace price for self-hosted",
    )
    # Billing keeps one price per machine: its time so far is priced at the new price too.
    assert member.client().get(f"{BASE}/runs/{run}/").json()["cost"] == "1.2000"
    audit = AuditEvent.objects.get(action="runner.price_set")
    assert (audit.target, audit.detail, audit.user_id) == (
        "lab-box",
        {"from": "0.000000", "to": "2.400000"},
        owner.user.pk,
    )


@pytest.mark.parametrize(
    ("price", "message"),
    [
        ("-1", "price_per_hour cannot be negative (-1): 0 makes the machine free"),
        ("abc", "price_per_hour must be a number of USD an hour such as 1.20, not 'abc'"),
        ("NaN", "price_per_hour must be a number of USD an hour such as 1.20, not 'NaN'"),
        ("20000", "price_per_hour 20000 is more than $10,000 an hour"),
        ("0.1234567", "price_per_hour 0.1234567 has more than 6 decimals"),
    ],
)
def test_a_bad_price_is_refused_saying_why_and_nothing_changes(owner: Person, price: str, message: str) -> None:
    machine = registered(owner, price="1.20")

    answer = owner.client().patch(f"{BASE}/runners/{machine.pk}/", {"price_per_hour": price}, format="json")
    token = owner.client().post(TOKENS, {"note": "x", "price_per_hour": price}, format="json")

    for refused in (answer, token):
        assert refused.status_code == 400
        assert refused.json()["message"] == message
    machine.refresh_from_db()
    assert str(machine.price_per_hour) == "1.200000"
    assert RunnerRegistrationToken.objects.count() == 1
    assert not AuditEvent.objects.filter(action="runner.price_set").exists()


def test_only_admins_set_a_price_and_never_another_workspaces(
    team: Workspace, owner: Person, member: Person, outsider: Person
) -> None:
    machine = registered(owner)
    other = Workspace.objects.create(slug="globex", name="Globex")
    Membership.objects.create(workspace=other, user=outsider.user, role=Role.ADMIN)

    refused = member.client().patch(f"{BASE}/runners/{machine.pk}/", {"price_per_hour": "9"}, format="json")
    unseen = outsider.client().patch(
        f"/api/v1/workspaces/globex/runners/{machine.pk}/", {"price_per_hour": "9"}, format="json"
    )

    assert refused.status_code == 403
    assert unseen.status_code == 404
    assert unseen.json()["message"] == "No such self-hosted runner in this workspace."
    machine.refresh_from_db()
    assert machine.price_per_hour == 0


def test_trainyard_runner_price_sets_it_and_runner_ls_shows_it(
    team: Workspace, owner: Person, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    registered(owner, name="lab-box")  # through Django's test client, before the CLI keeps the connection
    settings.ALLOWED_HOSTS = ["*"]
    cli_as(monkeypatch, team, owner)

    with in_the_tests_transaction():
        code, out, err = cli_invoke("runner", "price", "lab-box", "1.20")
        assert code == 0, err
        assert out == "lab-box: $1.2000/h (workspace price for self-hosted)\n"

        code, out, _ = cli_invoke("runner", "ls")
        assert out.splitlines()[0].split() == ["NAME", "STATUS", "HOST", "GPUS", "PRICE/H"]
        assert out.splitlines()[1].split() == ["lab-box", "idle", "lab-box", "0", "$1.2000"]

        code, _, err = cli_invoke("runner", "price", "no-such-box", "1")
        assert code == 1 and "No self-hosted runner named 'no-such-box'" in err
        code, _, err = cli_invoke("runner", "price", "--", "lab-box", "-3")
        assert code == 1 and "price_per_hour cannot be negative (-3)" in err
