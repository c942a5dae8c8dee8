"""moto's standalone server for the AWS tests, reached over HTTP by real boto3.

``MotoServer`` runs ``tests/support/moto_server.py`` (moto plus EC2 fault
injection) on a free port. Point boto3 at it with ``env`` (the standard
``AWS_ENDPOINT_URL`` and dummy credentials): in this process with
``activate()``, in a subprocess (the stack, a runner) by passing ``env``.

The fixtures (registered in tests/conftest.py):

- ``moto_server``: one server per session;
- ``aws``: per test: moto reset to empty, no faults, this process's boto3
  pointed at it; at the end the test fails if any instance tagged with an
  installation of ours is still pending, running, stopping or stopped.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
INSTALLATION_TAG = "trainyard:installation"
LIVE_STATES = ("pending", "running", "stopping", "stopped")
REGIONS = ("us-east-1", "eu-west-1")
START_TIMEOUT = 30.0


class MotoServer:
    def __init__(self, data_dir: Path, *, log_requests: bool = False) -> None:
        self.data_dir = data_dir
        self.faults_file = data_dir / "faults.json"
        self.behaviour_file = data_dir / "behaviour.json"
        # One JSON line per EC2 call (tests/support/moto_server.py), read by ``requests()``.
        self.requests_file = data_dir / "requests.jsonl" if log_requests else None
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._process: subprocess.Popen[bytes] | None = None
        self._saved_env: dict[str, str | None] = {}

    @property
    def env(self) -> dict[str, str]:
        """What a process needs to talk to this server with boto3."""
        return {
            "AWS_ENDPOINT_URL": self.url,
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
            "AWS_DEFAULT_REGION": "us-east-1",
            "AWS_EC2_METADATA_DISABLED": "true",
        }

    def start(self) -> MotoServer:
        self.faults_file.write_text("[]")
        self.behaviour_file.write_text("{}")
        log = open(self.data_dir / "moto.log", "ab")  # noqa: SIM115 - the child writes to it until stop()
        env = {
            **os.environ,
            "TRAINYARD_MOTO_FAULTS": str(self.faults_file),
            "TRAINYARD_MOTO_BEHAVIOUR": str(self.behaviour_file),
            "PYTHONPATH": str(REPO_ROOT),
        }
        if self.requests_file is not None:
            self.requests_file.write_text("")
            env["TRAINYARD_MOTO_REQUEST_LOG"] = str(self.requests_file)
        self._process = subprocess.Popen(
            [sys.executable, "-m", "tests.support.moto_server", "-H", "127.0.0.1", "-p", str(self.port)],
            cwd=REPO_ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(f"moto server exited at start; see {self.data_dir / 'moto.log'}")
            try:
                urllib.request.urlopen(f"{self.url}/moto-api/", timeout=1).close()
                return self
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"moto server did not answer within {START_TIMEOUT:.0f}s; see {self.data_dir / 'moto.log'}")

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.terminate()
            try:
                self._process.wait(10)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()

    def reset(self) -> None:
        """Forget every resource (moto's /moto-api/reset), every fault and
        behaviour, and switch IAM authentication off again."""
        self.clear_faults()
        self.behaviour_file.write_text("{}")
        self.set_iam_auth(False)
        request = urllib.request.Request(f"{self.url}/moto-api/reset", method="POST", data=b"")
        urllib.request.urlopen(request, timeout=10).close()

    @contextmanager
    def iam_auth(self) -> Iterator[None]:
        """Inside, moto authenticates and authorises every AWS call like IAM
        does (moto's ``/moto-api/reset-auth``): unknown keys are refused
        (``InvalidClientTokenId``, ``AuthFailure``) and a user may only do what
        its policies allow. The default ``testing`` keys are refused too, so
        create the IAM users and keys a test needs before entering."""
        self.set_iam_auth(True)
        try:
            yield
        finally:
            self.set_iam_auth(False)

    def set_iam_auth(self, on: bool) -> None:
        # The number of unauthenticated calls moto still allows: 0, or inf for off.
        request = urllib.request.Request(
            f"{self.url}/moto-api/reset-auth",
            method="POST",
            data=b"0" if on else b"inf",
            headers={"Content-Type": "text/plain"},  # a form content type would hide the body from moto
        )
        urllib.request.urlopen(request, timeout=10).close()

    def activate(self) -> None:
        """Point this process's boto3 at the server (undone by ``deactivate``)."""
        for key, value in self.env.items():
            self._saved_env.setdefault(key, os.environ.get(key))
            os.environ[key] = value

    def deactivate(self) -> None:
        for key, value in self._saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        self._saved_env.clear()

    # Faults (tests/support/moto_server.py reads the file at every call).

    def fault(
        self,
        action: str,
        code: str,
        *,
        message: str = "",
        times: int = 1,
        when: Mapping[str, str] | None = None,
        delay: float = 0.0,
    ) -> None:
        """Make the next ``times`` calls of EC2 ``action`` (matching ``when``,
        request parameters such as ``{"InstanceType": "g5.xlarge"}``; an id in
        ``InstanceIds``; ``{"Filter.Name": "tag:trainyard:key"}``) fail with
        ``code``, after ``delay`` seconds. With ``code`` "" the call only
        takes ``delay`` seconds longer (``delay``)."""
        faults = json.loads(self.faults_file.read_text() or "[]")
        faults.append(
            {
                "action": action,
                "code": code,
                "message": message,
                "times": times,
                "when": dict(when or {}),
                "delay": delay,
            }
        )
        self.faults_file.write_text(json.dumps(faults))

    def delay(self, action: str, seconds: float, *, times: int = 1, when: Mapping[str, str] | None = None) -> None:
        """The next ``times`` calls of ``action`` (matching ``when``) take
        ``seconds`` longer and then succeed: moto performs them even if the
        client is gone by then. ``delay_hits`` counts the delayed calls."""
        self.fault(action, "", times=times, when=when, delay=seconds)

    def delay_hits(self, action: str) -> int:
        return self.fault_hits(action, "")

    def fault_hits(self, action: str, code: str) -> int:
        faults = json.loads(self.faults_file.read_text() or "[]")
        return sum(f.get("hits", 0) for f in faults if f["action"] == action and f["code"] == code)

    def slow_terminate(self, seconds: float) -> None:
        """Terminated instances stay ``shutting-down`` this long (0: at once, moto's way)."""
        self.behaviour_file.write_text(json.dumps({"terminate_delay": seconds}))

    def requests(self, action: str | None = None) -> list[dict[str, Any]]:
        """The EC2 calls and presigned S3 requests moto got (with
        ``log_requests``), oldest first: action ("RunInstances", "presigned
        GET"), region, ``received`` / ``answered`` (epoch seconds), error code
        or "", and a presigned request's ``path`` (/bucket/key)."""
        if self.requests_file is None:
            raise RuntimeError("this MotoServer was started without log_requests=True")
        lines = self.requests_file.read_text().splitlines() if self.requests_file.exists() else []
        found = [json.loads(line) for line in lines if line.strip()]
        return [r for r in found if action is None or r["action"] == action]

    def clear_faults(self) -> None:
        self.faults_file.write_text("[]")

    # What is left running.

    def our_instances(self, *, states: tuple[str, ...] = LIVE_STATES) -> list[dict[str, Any]]:
        """Instances in ``states`` that carry an installation tag of ours, in every test region."""
        import boto3

        found: list[dict[str, Any]] = []
        for region in REGIONS:
            ec2 = boto3.client(
                "ec2",
                region_name=region,
                endpoint_url=self.url,
                aws_access_key_id="testing",
                aws_secret_access_key="testing",
            )
            pages = ec2.get_paginator("describe_instances").paginate(
                Filters=[
                    {"Name": "tag-key", "Values": [INSTALLATION_TAG]},
                    {"Name": "instance-state-name", "Values": list(states)},
                ]
            )
            for page in pages:
                for reservation in page["Reservations"]:
                    found.extend(reservation["Instances"])
        return found


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="session")
def moto_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MotoServer]:
    server = MotoServer(tmp_path_factory.mktemp("moto")).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def aws(moto_server: MotoServer) -> Iterator[MotoServer]:
    """An empty moto, this process's boto3 pointed at it, and at the end the
    check that nothing of ours is left running."""
    moto_server.reset()
    moto_server.activate()
    from backend.clouds.backends.aws.session import forget_sessions

    forget_sessions()
    try:
        yield moto_server
        left = moto_server.our_instances()
        assert not left, "instances of ours left running: " + ", ".join(
            f"{i['InstanceId']} ({i['State']['Name']})" for i in left
        )
    finally:
        moto_server.deactivate()
        forget_sessions()


def s3_account(workspace: Any, *, bucket: str = "ty-artifacts", name: str = "aws") -> Any:
    """A connected AWS account of ``workspace`` whose config names ``bucket``
    (created in moto), with moto's access keys encrypted as the connect flow
    stores them. Needs the ``aws`` fixture."""
    import boto3

    from backend.clouds.models import BackendKind, CloudAccount
    from backend.vault.crypto import encrypt

    boto3.client("s3", region_name="us-east-1").create_bucket(Bucket=bucket)
    credentials = {"access_key_id": "testing", "secret_access_key": "testing"}
    return CloudAccount.objects.create(
        workspace=workspace,
        kind=BackendKind.AWS,
        name=name,
        config={"bucket": bucket, "regions": ["us-east-1"]},
        credentials_ciphertext=encrypt(json.dumps(credentials)),
    )
