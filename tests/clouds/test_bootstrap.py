"""A machine that boots from an image: its user data (a small POSIX sh
script holding the server URL, its name and a single-use token, nothing else
secret), and the exchange of that token for the runner's own at its first
hello (services and the real websocket consumer)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from django.conf import settings as django_settings
from trainyard_runner import protocol

from backend.accounts.models import Workspace
from backend.clouds.backends.base import Requirements
from backend.clouds.models import CloudAccount, Instance
from backend.clouds.services.accounts import compute_of
from backend.clouds.services.bootstrap import MAX_BYTES, user_data
from backend.clouds.services.instances import (
    instance_bootstrap_exchange,
    instance_for_bootstrap_token,
    instance_for_token,
    instance_request,
    runner_token,
)
from backend.clouds.services.provisioning import _spec, instance_launch_run, instance_terminate_run
from backend.config.asgi import application
from backend.core.tokens import hash_token
from tests.support import booting

HELLO = protocol.Hello(
    version="test", hostname="box", resources=protocol.Resources(cpus=2, memory_bytes=2**31, disk_bytes=2**33)
)
OFFERS = [{"instance_type": "boot.small", "region": "test-1", "cpus": 2, "memory_gib": 4, "price_per_hour": 0.1}]


def _script(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "user-data.sh"
    path.write_text(text)
    return path


def test_the_user_data_is_small_posix_sh_with_the_url_name_and_token(tmp_path: Path) -> None:
    text = user_data(
        server_url="https://trainyard.example.com/",
        instance_name="aws-1234abcd",
        bootstrap_token="tok-123",
        cloud="aws",
    )
    assert len(text.encode()) < MAX_BYTES == 16 * 1024
    assert text.startswith("#!/bin/sh\n") and "\nset -eu\n" in text
    assert "SERVER_URL=https://trainyard.example.com\n" in text
    assert "INSTANCE_NAME=aws-1234abcd\n" in text and "BOOTSTRAP_TOKEN=tok-123\n" in text
    path = _script(tmp_path, text)
    subprocess.run(["sh", "-n", str(path)], check=True)
    if shutil.which("dash"):  # /bin/sh on Debian and Ubuntu
        subprocess.run(["dash", "-n", str(path)], check=True)
    if shutil.which("bash"):
        subprocess.run(["bash", "--posix", "-n", str(path)], check=True)


def test_the_user_data_holds_no_secret_of_the_server_but_the_bootstrap_token() -> None:
    text = user_data(server_url="http://127.0.0.1:8000", instance_name="x", bootstrap_token="tok", cloud="aws")
    secrets_of_the_server = [
        django_settings.SECRET_KEY,
        *django_settings.TRAINYARD["SECRET_KEYS"],
        str(django_settings.DATABASES["default"].get("PASSWORD") or "no-password-set"),
        str(django_settings.DATABASES["default"]["NAME"]),
    ]
    for secret in secrets_of_the_server:
        assert secret not in text
    assigned = [line.split("=", 1)[0] for line in text.splitlines()[:14] if "=" in line and line[0].isupper()]
    assert assigned == ["SERVER_URL", "INSTANCE_NAME", "BOOTSTRAP_TOKEN", "CLOUD", "MAX_LIFETIME", "POWER_OFF_AFTER"]


def test_odd_values_are_quoted_for_the_shell(tmp_path: Path) -> None:
    text = user_data(server_url="http://h:1", instance_name="a b'$(touch x)", bootstrap_token="t", cloud="")
    path = _script(tmp_path, "\n".join(line for line in text.splitlines()[:14]) + '\nprintf %s "$INSTANCE_NAME"\n')
    out = subprocess.run(["sh", str(path)], check=True, capture_output=True, text=True, cwd=tmp_path).stdout
    assert out == "a b'$(touch x)" and not (tmp_path / "x").exists()


@pytest.fixture
def booting_account(team: Workspace, tmp_path: Path, settings: Any) -> Any:
    settings.TRAINYARD = {
        **settings.TRAINYARD,
        "LOCAL_BACKEND_ENABLED": False,
        "BACKEND_KINDS": {booting.KIND: booting.IMPORT},
    }
    config = {"state_dir": str(tmp_path / "state"), "offers": OFFERS}
    account = CloudAccount.objects.create(workspace=team, kind=booting.KIND, name="booting", config=config)
    yield account
    for instance in Instance.objects.filter(account=account):
        instance_terminate_run(instance_id=str(instance.pk))
    assert list(compute_of(account).list_managed()) == []


def _request(account: CloudAccount) -> Instance:
    offer = next(iter(compute_of(account).offers(Requirements())))
    return instance_request(account=account, offer=offer, job_id=None, reason_text="test")


def test_a_booting_machine_gets_user_data_whose_token_is_only_a_bootstrap_token(
    booting_account: CloudAccount, tmp_path: Path
) -> None:
    instance = _request(booting_account)
    derived = runner_token(instance.idempotency_key)
    assert instance_for_token(token=derived) is None  # not a runner token: single use, below
    assert instance_for_bootstrap_token(token=derived) == instance

    assert instance_launch_run(instance_id=str(instance.pk)).status == "launched"
    script = booting.user_data_of(tmp_path / "state", instance.idempotency_key)
    assert f"BOOTSTRAP_TOKEN={derived}\n" in script and f"INSTANCE_NAME={instance.name}\n" in script
    # A redelivered launch task asks for the very same machine.
    assert _spec(instance, boots_from_image=True).user_data == script
    assert _spec(instance).user_data == ""


def test_the_bootstrap_token_is_exchanged_once(booting_account: CloudAccount) -> None:
    instance = _request(booting_account)
    bootstrap = runner_token(instance.idempotency_key)
    own = instance_bootstrap_exchange(instance_id=str(instance.pk), token=bootstrap)
    assert own and own != bootstrap
    assert instance_bootstrap_exchange(instance_id=str(instance.pk), token=bootstrap) is None
    assert instance_for_bootstrap_token(token=bootstrap) is None
    assert instance_for_token(token=own) == instance
    instance.refresh_from_db()
    assert instance.token_hash == hash_token(own) and instance.bootstrap_used_at is not None


def test_a_local_machine_keeps_its_direct_token(team: Workspace, settings: Any, tmp_path: Path) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "LOCAL_BACKEND_ENABLED": False}
    config = {"state_dir": str(tmp_path / "state"), "offers": OFFERS}
    account = CloudAccount.objects.create(workspace=team, kind="fake", name="fake", config=config)
    instance = _request(account)
    assert instance.bootstrap_token_hash == ""
    assert instance_for_token(token=runner_token(instance.idempotency_key)) == instance


# ---------------------------------------------------------------- the consumer


def _connect(token: str) -> WebsocketCommunicator:
    return WebsocketCommunicator(application, "/ws/runner/", headers=[(b"authorization", f"Bearer {token}".encode())])


async def _hello(token: str) -> dict[str, Any]:
    ws = _connect(token)
    await ws.connect()
    await ws.send_to(text_data=HELLO.model_dump_json())
    answer = await ws.receive_output(timeout=5)
    await ws.disconnect()
    return dict(answer)


@pytest.mark.django_db(transaction=True)
def test_the_first_hello_with_the_bootstrap_token_gets_the_runners_own_and_a_second_is_refused(
    booting_account: CloudAccount,
) -> None:
    instance = _request(booting_account)
    bootstrap = runner_token(instance.idempotency_key)

    first = async_to_sync(_hello)(bootstrap)
    welcome = json.loads(first["text"])
    assert welcome["type"] == "welcome" and welcome["instance"] == str(instance.pk)
    own = welcome["token"]
    assert own and own != bootstrap

    assert async_to_sync(_hello)(bootstrap) == {"type": "websocket.close", "code": protocol.CLOSE_UNAUTHORIZED}

    again = json.loads(async_to_sync(_hello)(own)["text"])
    assert again["type"] == "welcome" and again["token"] == ""
    instance.refresh_from_db()
    assert instance.status == "idle"


# ---------------------------------------------------------------- the served wheels


def test_without_a_package_index_the_wheels_answer_503_with_what_to_do(
    settings: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, client: Any
) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "RUNNER_WHEELHOUSE": tmp_path / "wheels"}
    for name, value in {
        "PIP_CONFIG_FILE": os.devnull,  # not this machine's mirrors
        "PIP_INDEX_URL": "http://127.0.0.1:9/simple",
        "PIP_RETRIES": "0",
        "PIP_TIMEOUT": "2",
    }.items():
        monkeypatch.setenv(name, value)

    answer = client.get("/runner/wheels/")
    assert answer.status_code == 503 and answer["Retry-After"] == "30"
    text = answer.content.decode()
    assert text.startswith("the runner's wheels are not available: could not download the runner's wheels for ")
    assert "manage.py runner_wheels" in text and "Traceback" not in text
    assert [p.name for p in (tmp_path / "wheels").iterdir()] == [".lock"]  # nothing half-made


def test_a_wheel_name_that_is_no_file_name_is_refused_before_anything_is_made(
    settings: Any, tmp_path: Path, client: Any
) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "RUNNER_WHEELHOUSE": tmp_path / "wheels"}
    assert client.get("/runner/wheels/%3Cscript%3E.whl").status_code == 404
    assert client.get("/runner/wheels/x.tar.gz").status_code == 404
    assert not (tmp_path / "wheels").exists()


def test_a_runner_naming_another_machine_is_refused_and_one_whose_launch_was_not_recorded_fills_it_in(
    booting_account: CloudAccount,
) -> None:
    from backend.runs.services.runners import runner_connect

    instance = _request(booting_account)
    assert instance.backend_id == ""  # a worker killed before it recorded the launch
    on_machine = HELLO.model_copy(update={"cloud": protocol.CloudIdentity(instance_id="i-0aaa", region="test-1")})

    connected = runner_connect(instance_id=str(instance.pk), hello=on_machine, channel_name="c1", heartbeat_seconds=1)

    assert connected.instance is not None
    instance.refresh_from_db()
    assert instance.backend_id == "i-0aaa", "the machine said who it is: it can be terminated by its id"
    elsewhere = HELLO.model_copy(update={"cloud": protocol.CloudIdentity(instance_id="i-0bbb", region="test-1")})
    refused = runner_connect(instance_id=str(instance.pk), hello=elsewhere, channel_name="c2", heartbeat_seconds=1)
    assert refused.instance is None
    assert refused.refusal == f"this runner's token belongs to {instance.name} (i-0aaa), not to machine i-0bbb"


def test_the_systemd_unit_in_the_user_data_is_valid_and_leaves_the_jobs_alone_on_restart(tmp_path: Path) -> None:
    """systemd itself cannot run here; systemd-analyze checks the unit the
    script writes, expanded by sh as on the machine."""
    import shutil
    import subprocess

    analyze = shutil.which("systemd-analyze")
    assert analyze, "systemd-analyze (Debian package systemd) is needed to check the runner's unit"
    text = user_data(server_url="https://t.example.com", instance_name="aws-1", bootstrap_token="tok", cloud="aws")
    head = "cat > /etc/systemd/system/trainyard-runner.service <<UNIT\n"
    body = text[text.index(head) + len(head) : text.index("\nUNIT\n", text.index(head))]
    unit = subprocess.run(
        ["sh", "-c", f"cat <<UNIT\n{body}\nUNIT\n"],
        env={"ROOT": str(tmp_path), "INSTANCE_NAME": "aws-1", "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    runner = tmp_path / "run-runner"
    runner.write_text("#!/bin/sh\n")
    runner.chmod(0o700)
    path = tmp_path / "trainyard-runner.service"
    path.write_text(unit)

    checked = subprocess.run([analyze, "verify", "--man=no", str(path)], capture_output=True, text=True)

    assert checked.stderr.strip() == "" and checked.returncode == 0, checked.stderr
    assert f"ExecStart={runner}\n" in unit and "Restart=on-failure\n" in unit
    assert "KillMode=process\n" in unit, "systemd must not kill the jobs' shims when the runner restarts"
