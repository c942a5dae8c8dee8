"""``trainyard notify add|ls|rm|test|log`` against the real API (in the
test's process) and a real webhook receiver."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from backend.accounts.models import Workspace
from backend.notify.models import Delivery, Subscription
from backend.notify.services import delivery_send
from tests.notify.conftest import Receiver
from tests.support.cli_wsgi import cli_as, cli_invoke, in_the_tests_transaction
from tests.support.fixtures import Person


@pytest.fixture
def _cli(settings: Any, monkeypatch: pytest.MonkeyPatch, team: Workspace, owner: Person) -> Iterator[None]:
    settings.ALLOWED_HOSTS = ["*"]
    cli_as(monkeypatch, team, owner)
    with in_the_tests_transaction():
        yield


@pytest.mark.usefixtures("_cli", "private")
def test_add_prints_the_secret_once_then_ls_test_log_and_rm(receiver: Receiver) -> None:
    code, out, _ = cli_invoke("notify", "add", "webhook", receiver.url, "--event", "run.failed")
    assert code == 0, out
    subscription = Subscription.objects.get()
    assert out.startswith(f"{subscription.pk}  webhook {receiver.url}  (run.failed)\n")
    assert "Signing secret (shown once; store it where the receiver reads it): whsec_" in out

    code, out, _ = cli_invoke("notify", "ls")
    assert code == 0 and "whsec_" not in out
    assert out.splitlines()[0].split() == ["ID", "KIND", "SCOPE", "TARGET", "EVENTS", "STATE", "BY"]
    assert out.splitlines()[1].split() == [str(subscription.pk), "webhook", "workspace", receiver.url, "run.failed",
                                           "enabled", "olivia"]  # fmt: skip

    code, _, err = cli_invoke("notify", "test", str(subscription.pk))
    assert code == 0 and f"trainyard notify log {subscription.pk}" in err
    receiver.answers = [502]
    delivery_send(delivery_id=str(Delivery.objects.get().pk))

    code, out, _ = cli_invoke("notify", "log", str(subscription.pk))
    assert out.splitlines()[1].split()[:4] == ["test", "pending", "1", "502"]
    assert out.rstrip().endswith("the receiver answered 502 Bad Gateway")

    code, _, err = cli_invoke("notify", "rm", str(subscription.pk))
    assert code == 0 and not Subscription.objects.exists()


@pytest.mark.usefixtures("_cli", "private")
def test_add_with_the_budget_events_subscribes_to_them_without_a_warning(receiver: Receiver) -> None:
    code, _, err = cli_invoke("notify", "add", "webhook", receiver.url, "--event", "run.failed", "--event", "budget.80")

    assert code == 0, err
    assert "warning" not in err
    assert Subscription.objects.get().events == ["run.failed", "budget.80"]


@pytest.mark.usefixtures("_cli")
def test_add_to_loopback_says_why_and_what_to_set(receiver: Receiver) -> None:
    code, _, err = cli_invoke("notify", "add", "slack", receiver.url)

    assert code != 0
    assert "its host resolves to 127.0.0.1, a loopback address" in err
    assert "TRAINYARD_NOTIFY_PRIVATE_NETWORKS" in err
    assert not Subscription.objects.exists()
