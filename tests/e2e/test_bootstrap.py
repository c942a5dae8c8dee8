"""A fresh EC2 machine becomes a runner of the stack: moto runs an instance
with our user data, and tests/support/ec2boot.py plays its boot (the script
unmodified, in a scratch folder, with its own instance metadata service).

The Instance row and the user data come from the services, as provisioning
makes them for a backend that boots from an image (no EC2 backend needed);
RunInstances is a raw boto3 call carrying the user data and our tags. Every
test ends with nothing of ours running in moto (the ``aws`` fixture)."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.support.ec2boot import Ec2Boot
from tests.support.moto import MotoServer
from tests.support.stack import Stack

INSTALLATION = "boot-tests"
RESOURCES = {"cpus": 1, "memory_bytes": 2**30, "disk_bytes": 2**30}
MAKE_ROW = """
import json, secrets, uuid
from django.conf import settings
from django.utils import timezone
from backend.accounts.models import Workspace
from backend.clouds.models import CloudAccount, Instance
from backend.clouds.services.bootstrap import user_data
from backend.clouds.services.instances import runner_token
from backend.core.tokens import hash_token
settings.TRAINYARD["RUNNER_MAX_LIFETIME_SECONDS"] = {max_lifetime}
settings.TRAINYARD["RUNNER_POWER_OFF_AFTER_SECONDS"] = {power_off_after}
ws, _ = Workspace.objects.get_or_create(slug="boot-tests", defaults={{"name": "Boot tests"}})
# The runner proves its machine with the signed identity document: the row names
# the account (moto's id, as connecting records it) and the region it was launched in.
config = {{"regions": ["us-east-1"], "aws_account_id": "123456789012"}}
account, _ = CloudAccount.objects.get_or_create(workspace=ws, name="aws", defaults={{"kind": "aws", "config": config}})
pk = uuid.uuid4()
key = f"ty-{{pk}}"
token = runner_token(key)
row = Instance.objects.create(
    id=pk, workspace=ws, account=account, backend="aws", region="us-east-1", name=f"aws-{{pk.hex[:8]}}",
    idempotency_key=key,
    token_hash=hash_token(secrets.token_hex(32)), bootstrap_token_hash=hash_token(token), launched_at=timezone.now(),
)
script = user_data(server_url=settings.PUBLIC_URL, instance_name=row.name, bootstrap_token=token, cloud="aws")
print(json.dumps({{"id": str(pk), "name": row.name, "token": token, "user_data": script}}))
"""
READ_ROW = """
import json
from backend.clouds.models import Instance
i = Instance.objects.get(pk="{pk}")
print(json.dumps({{"status": i.status, "used": i.bootstrap_used_at is not None, "hostname": i.hostname}}))
"""


@pytest.fixture
def boot(ec2_boot: Ec2Boot) -> Ec2Boot:
    return ec2_boot


def _ec2(aws: MotoServer) -> Any:
    import boto3

    return boto3.client("ec2", region_name="us-east-1", endpoint_url=aws.url)


def _row(stack: Stack, *, max_lifetime: float = 0, power_off_after: float = 0) -> dict[str, str]:
    code = MAKE_ROW.format(max_lifetime=max_lifetime, power_off_after=power_off_after)
    return dict(json.loads(stack.manage("shell", "-c", code).strip().splitlines()[-1]))


def _read(stack: Stack, pk: str) -> dict[str, Any]:
    return dict(json.loads(stack.manage("shell", "-c", READ_ROW.format(pk=pk)).strip().splitlines()[-1]))


def _launch(aws: MotoServer, row: dict[str, str]) -> str:
    ec2 = _ec2(aws)
    image = ec2.describe_images(Owners=["amazon"])["Images"][0]["ImageId"]
    tags = {"trainyard:installation": INSTALLATION, "trainyard:instance": row["id"], "Name": row["name"]}
    answer = ec2.run_instances(
        ImageId=image,
        InstanceType="t3.micro",
        MinCount=1,
        MaxCount=1,
        UserData=row["user_data"],  # boto3 base64-encodes it
        InstanceInitiatedShutdownBehavior="terminate",
        MetadataOptions={"HttpTokens": "required", "HttpPutResponseHopLimit": 1},
        TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}],
    )
    return str(answer["Instances"][0]["InstanceId"])


def _wait_log(boot: Ec2Boot, instance_id: str, pattern: str, count: int = 1, timeout: float = 180.0) -> str:
    deadline = time.monotonic() + timeout
    while True:
        log = boot.log(instance_id)
        if len(re.findall(pattern, log)) >= count:
            return log
        assert time.monotonic() < deadline, f"no {pattern!r} ×{count} in the boot log:\n{log[-4000:]}"
        assert instance_id not in boot.ended, f"the machine ended before {pattern!r}:\n{log[-4000:]}"
        time.sleep(0.3)


def _state(aws: MotoServer, instance_id: str) -> str:
    found = _ec2(aws).describe_instances(InstanceIds=[instance_id])
    return str(found["Reservations"][0]["Instances"][0]["State"]["Name"])


def _runner_pids(home: Path) -> list[int]:
    runner = str(home / "venv" / "bin" / "trainyard-runner")
    found = []
    for proc in psutil.process_iter():
        try:
            if any(runner in part for part in proc.cmdline()):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def test_a_booted_machine_says_hello_once_with_its_bootstrap_token_keeps_its_own_and_ends_at_its_lifetime(
    stack: Stack, aws: MotoServer, boot: Ec2Boot
) -> None:
    row = _row(stack, max_lifetime=45)
    instance_id = _launch(aws, row)
    boot.wait_booted(1)

    log = _wait_log(boot, instance_id, r"connected to .* as instance " + row["id"])
    assert "exchanged the bootstrap token for the runner's own" in log
    seen = _read(stack, row["id"])
    assert seen["status"] == "idle" and seen["used"]
    home = boot.home(instance_id)
    saved = home / "work" / "runner-token"
    assert (saved.stat().st_mode & 0o777) == 0o600 and saved.read_text().strip() != row["token"]

    # The bootstrap token is spent: a second hello with it is refused.
    ws_url = stack.ws_url + "/ws/runner/"
    # Refused at the connect or at the hello, whichever the close reaches first.
    with (
        pytest.raises(ConnectionClosed) as refused,
        connect(ws_url, additional_headers={"Authorization": f"Bearer {row['token']}"}) as ws,
    ):
        ws.send(json.dumps({"type": "hello", "version": "t", "hostname": "h", "resources": RESOURCES}))
        ws.recv(timeout=10)
    assert refused.value.rcvd is not None and refused.value.rcvd.code == 4401

    # The runner dies; the boot's loop starts it again, and the saved token wins.
    for pid in _runner_pids(home):
        os.kill(pid, signal.SIGKILL)
    log = _wait_log(boot, instance_id, r"connected to .* as instance " + row["id"], count=2, timeout=60)
    assert "server refused this runner" not in log

    # 45 s after the runner first started: it stops, powers off, and moto ends the machine.
    boot.wait_ended(instance_id, timeout=90)
    assert boot.powered_off == [instance_id]
    assert _state(aws, instance_id) in ("shutting-down", "terminated")
    log = boot.log(instance_id)
    assert "powering the machine off (the runner reached its maximum lifetime of 45 s)" in log
    assert row["token"] not in log and saved.read_text().strip() not in log  # no token in any log


def test_a_booted_machine_cut_off_from_the_server_while_idle_powers_off(
    stack: Stack, aws: MotoServer, boot: Ec2Boot
) -> None:
    row = _row(stack, power_off_after=3)
    instance_id = _launch(aws, row)
    boot.wait_booted(1)
    _wait_log(boot, instance_id, r"connected to .* as instance " + row["id"])
    identity = boot.facts[instance_id]
    assert identity["instance-id"] == instance_id

    stack.stop("web")
    try:
        boot.wait_ended(instance_id, timeout=60)
    finally:
        stack.start("web")
    assert boot.powered_off == [instance_id]
    assert "server unreachable for 3s while idle; the machine powers off" in boot.log(instance_id)
    assert _state(aws, instance_id) in ("shutting-down", "terminated")


def test_the_served_index_installs_the_runner_into_a_fresh_venv(stack: Stack, tmp_path: Path) -> None:
    wheels = f"{stack.url}/runner/wheels/"
    started = time.monotonic()
    with urllib.request.urlopen(wheels, timeout=600) as page:
        index = page.read().decode()
    made_in = time.monotonic() - started
    names = re.findall(r'href="([^"#]+)#sha256=[0-9a-f]{64}"', index)
    assert any(n.startswith("trainyard_runner-") for n in names)
    assert any(n.startswith("pip-") for n in names)
    for python in ("cp311", "cp312", "cp313"):
        for arch in ("x86_64", "aarch64"):
            assert any(n.startswith("pydantic_core-") and f"-{python}-" in n and arch in n for n in names)
    pip_wheel = tmp_path / next(n for n in names if n.startswith("pip-"))
    urllib.request.urlretrieve(wheels + pip_wheel.name, pip_wheel)

    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "python"), f"{pip_wheel}/pip", "install", "--isolated", "--quiet", "--no-index",
         "--find-links", wheels, "trainyard-runner"],
        check=True, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
    )  # fmt: skip
    shown = subprocess.run([str(venv / "bin" / "trainyard-runner"), "--help"], capture_output=True, text=True)
    assert shown.returncode == 0 and "--power-off-after" in shown.stdout
    print(f"wheel index answered in {made_in:.1f}s", file=sys.stderr)

    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(wheels + "nothing-1.0-py3-none-any.whl", timeout=30)
    assert missing.value.code == 404
