"""Plays EC2's boot for the instances moto runs: their user data, unmodified,
on this machine.

For each instance moto reports ``running`` with our installation tag, the
helper reads its user data (DescribeInstanceAttribute ``userData``, base64)
and runs it with ``sh`` in a scratch folder of its own, as EC2 runs it as
root at first boot. What differs from a real machine comes only from the
environment the script is given:

- ``TRAINYARD_BOOT_ROOT``: the scratch folder instead of /opt/trainyard;
- ``TRAINYARD_BOOT_FOREGROUND=1``: the runner in the foreground (no systemd);
- ``AWS_EC2_METADATA_SERVICE_ENDPOINT``: this helper's instance metadata
  service (IMDSv2: a session token first; instance id, type, region, zone of
  that instance, and its instance identity document with its ``rsa2048``
  signature by the test key the server trusts (tests/support/iid.py); ``spot/instance-action`` and
  ``events/recommendations/rebalance`` 404 until the test calls
  ``notice(instance_id, action, at)`` or ``rebalance(instance_id)``);
- ``TRAINYARD_POWER_OFF_COMMAND``: a script that tells this helper, which
  then ends the instance in moto as its shutdown behaviour says (terminate,
  unless it says stop).

When moto says an instance is no longer running (terminated by the server,
by the power-off, or by the test), the helper kills everything its boot
started.

EBS volumes (``Volumes``): each volume of ours moto has is a sparse file;
while moto says it is attached to a booted instance, the file is a loop
device (``losetup``), linked in that instance's device folder as
``nvme-Amazon_Elastic_Block_Store_vol<hex>`` (the runner's
``TRAINYARD_RUNNER_DEVICE_DIR``), as a Nitro machine's udev links it. When
the volume is detached or its instance ends, the link goes and the loop
device is freed; one still mounted then is a fault of the runner (its job's
end unmounts it first): it is unmounted and recorded in ``volume_faults``.
Not played: a real NVMe device, real zones (moto places anything anywhere). ``start()`` / ``stop()``; ``booted``, ``powered_off``, ``log(id)``.
The ``ec2_boot`` fixture (registered in tests/conftest.py) wraps it. Only
instances in us-east-1 (``region``) are booted.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from tests.support import iid
from tests.support.moto import INSTALLATION_TAG, MotoServer

SESSION_TOKEN = "imds-session-token"
# The instance identity document and its rsa2048 signature, by the test key (tests/support/iid.py).
IDENTITY_DOCUMENT = "dynamic/instance-identity/document"
IDENTITY_SIGNATURE = "dynamic/instance-identity/rsa2048"
PLAIN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


class Ec2Boot:
    def __init__(
        self, aws: MotoServer, root: Path, *, region: str = "us-east-1", env: Mapping[str, str] | None = None
    ) -> None:
        self.aws = aws
        self.root = root
        self.region = region
        self.extra_env = dict(env or {})
        self.booted: dict[str, subprocess.Popen[bytes]] = {}
        self.facts: dict[str, dict[str, str]] = {}
        self.powered_off: list[str] = []
        self.ended: set[str] = set()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None
        self._imds = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._imds_thread = threading.Thread(target=self._imds.serve_forever, daemon=True)
        self.imds_url = f"http://127.0.0.1:{self._imds.server_address[1]}"
        self.errors: list[str] = []
        self.volumes = Volumes(root / "ebs")

    # ------------------------------------------------------------ lifecycle

    def start(self) -> Ec2Boot:
        self.root.mkdir(parents=True, exist_ok=True)
        self._imds_thread.start()
        self._watcher = threading.Thread(target=self._watch, name="ec2boot", daemon=True)
        self._watcher.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._watcher is not None:
            self._watcher.join(15)
        for instance_id in list(self.booted):
            self._kill(instance_id)
        self.volumes.release_all()
        self._imds.shutdown()
        self._imds.server_close()

    def log(self, instance_id: str) -> str:
        path = self.root / instance_id / "boot.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def device_dir(self, instance_id: str) -> Path:
        """The instance's /dev/disk/by-id (TRAINYARD_RUNNER_DEVICE_DIR)."""
        return self.root / instance_id / "dev-by-id"

    def home(self, instance_id: str) -> Path:
        """The instance's TRAINYARD_BOOT_ROOT (its /opt/trainyard)."""
        return self.root / instance_id / "opt"

    def wait_booted(self, count: int = 1, timeout: float = 60.0) -> list[str]:
        deadline = time.monotonic() + timeout
        while len(self.booted) < count:
            assert time.monotonic() < deadline, f"moto ran no instance to boot within {timeout:.0f}s: {self.errors}"
            time.sleep(0.2)
        return list(self.booted)

    def wait_ended(self, instance_id: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while instance_id not in self.ended:
            assert time.monotonic() < deadline, f"{instance_id} still runs; log:\n{self.log(instance_id)[-3000:]}"
            time.sleep(0.2)

    # -------------------------------------------------------------- the boot

    def _ec2(self) -> Any:
        import boto3

        return boto3.client(
            "ec2",
            region_name=self.region,
            endpoint_url=self.aws.url,
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def _watch(self) -> None:
        ec2 = self._ec2()
        while not self._stop.is_set():
            try:
                self._pass(ec2)
            except Exception as e:  # moto restarting, a test's reset: look again
                self.errors.append(f"{type(e).__name__}: {e}")
            self._stop.wait(0.3)

    def _pass(self, ec2: Any) -> None:
        found = ec2.describe_instances(Filters=[{"Name": "tag-key", "Values": [INSTALLATION_TAG]}])
        states = {i["InstanceId"]: i for r in found["Reservations"] for i in r["Instances"]}
        for instance_id, instance in states.items():
            state = instance["State"]["Name"]
            if state == "running" and instance_id not in self.booted and instance_id not in self.ended:
                self._boot(ec2, instance)
            elif state != "running" and instance_id in self.booted and instance_id not in self.ended:
                self._kill(instance_id)
        for instance_id in list(self.booted):
            if instance_id not in states and instance_id not in self.ended:
                self._kill(instance_id)  # gone from moto altogether (a reset)
        live = {i for i in self.booted if i not in self.ended}
        self.volumes.follow(ec2, {i: self.device_dir(i) for i in live})

    def _boot(self, ec2: Any, instance: dict[str, Any]) -> None:
        instance_id = instance["InstanceId"]
        attribute = ec2.describe_instance_attribute(InstanceId=instance_id, Attribute="userData")
        encoded = attribute.get("UserData", {}).get("Value", "")
        here = self.root / instance_id
        here.mkdir(parents=True, exist_ok=True)
        self.device_dir(instance_id).mkdir(exist_ok=True)
        script = here / "user-data"
        script.write_bytes(base64.b64decode(encoded) if encoded else b"")
        instance_type = instance.get("InstanceType", "")
        zone = instance.get("Placement", {}).get("AvailabilityZone", "")
        document, signature = iid.signed(
            instance_id=instance_id, region=self.region, instance_type=instance_type, zone=zone
        )
        self.facts[instance_id] = {
            "instance-id": instance_id,
            "instance-type": instance_type,
            "placement/region": self.region,
            "placement/availability-zone": zone,
            IDENTITY_DOCUMENT: document,
            IDENTITY_SIGNATURE: signature,
        }
        power_off = here / "power-off"
        power_off.write_text(
            "#!/bin/sh\n"
            f"exec python3 -c \"import urllib.request as u; u.urlopen(u.Request('{self.imds_url}/{instance_id}"
            "/trainyard-test/power-off', data=b'', method='POST'), timeout=10)\"\n"
        )
        power_off.chmod(0o755)
        env = {
            "PATH": PLAIN_PATH,
            "HOME": str(here),
            "LANG": "C.UTF-8",
            "TRAINYARD_BOOT_ROOT": str(self.home(instance_id)),
            "TRAINYARD_BOOT_FOREGROUND": "1",
            "TRAINYARD_POWER_OFF_COMMAND": str(power_off),
            "AWS_EC2_METADATA_SERVICE_ENDPOINT": f"{self.imds_url}/{instance_id}",
            "TRAINYARD_RUNNER_DEVICE_DIR": str(self.device_dir(instance_id)),
            **self.extra_env,
        }
        with open(here / "boot.log", "ab") as log:
            self.booted[instance_id] = subprocess.Popen(
                ["sh", str(script)],
                cwd=here,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def _kill(self, instance_id: str) -> None:
        self.ended.add(instance_id)
        process = self.booted.get(instance_id)
        if process is None or process.poll() is not None:
            return
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                return
            try:
                process.wait(5)
                break
            except subprocess.TimeoutExpired:
                continue
        _kill_leftovers(self.home(instance_id))

    def pull_the_plug(self, instance_id: str) -> None:
        """The machine goes without a word (a reclaim with no notice, a
        terminate from the console): everything on it SIGKILLed at once, its
        runner's socket dropped, then moto terminates the instance."""
        self.ended.add(instance_id)
        process = self.booted.get(instance_id)
        if process is not None and process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait(5)
        _kill_leftovers(self.home(instance_id))
        self._ec2().terminate_instances(InstanceIds=[instance_id])

    def _power_off(self, instance_id: str) -> None:
        """The machine shuts itself down: moto ends it as its shutdown behaviour says."""
        self.powered_off.append(instance_id)
        ec2 = self._ec2()
        behaviour = ec2.describe_instance_attribute(
            InstanceId=instance_id, Attribute="instanceInitiatedShutdownBehavior"
        )
        if behaviour.get("InstanceInitiatedShutdownBehavior", {}).get("Value") == "stop":
            ec2.stop_instances(InstanceIds=[instance_id])
        else:
            ec2.terminate_instances(InstanceIds=[instance_id])

    # -------------------------------------------------------- metadata service

    def notice(self, instance_id: str, action: str, at: float) -> None:
        """From now on the instance's metadata has a spot interruption notice for ``at`` (unix time)."""
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(at))
        self.facts[instance_id]["spot/instance-action"] = json.dumps({"action": action, "time": when})

    def rebalance(self, instance_id: str) -> None:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
        self.facts[instance_id]["events/recommendations/rebalance"] = json.dumps({"noticeTime": when})

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        boot = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_PUT(self) -> None:
                _, path = self._split()
                if path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
                    self._answer(200, SESSION_TOKEN)
                else:
                    self._answer(400, "")

            def do_POST(self) -> None:
                instance_id, path = self._split()
                if path == "/trainyard-test/power-off" and instance_id in boot.facts:
                    self._answer(200, "")
                    threading.Thread(target=boot._power_off, args=(instance_id,), daemon=True).start()
                else:
                    self._answer(404, "")

            def do_GET(self) -> None:
                instance_id, path = self._split()
                if self.headers.get("X-aws-ec2-metadata-token") != SESSION_TOKEN:
                    self._answer(401, "")  # IMDSv2 only, as our launches require
                    return
                facts = boot.facts.get(instance_id, {})
                key = path.removeprefix("/latest/meta-data/" if path.startswith("/latest/meta-data/") else "/latest/")
                if key in facts:
                    self._answer(200, facts[key])
                else:
                    self._answer(404, "")  # spot/instance-action: no notice

            def _split(self) -> tuple[str, str]:
                _, instance_id, rest = self.path.split("/", 2) if self.path.count("/") >= 2 else ("", "", "")
                return instance_id, "/" + rest

            def _answer(self, status: int, body: str) -> None:
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

        return Handler


class Volumes:
    """Moto's EBS volumes of ours as sparse files and loop devices (see the module's docstring)."""

    NVME = "nvme-Amazon_Elastic_Block_Store_"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.loops: dict[str, tuple[str, str, Path]] = {}  # volume id → (instance id, loop device, link)
        self.volume_faults: list[str] = []
        self.attached: list[tuple[str, str]] = []  # (volume id, instance id), every attachment seen

    def follow(self, ec2: Any, devices: Mapping[str, Path]) -> None:
        """One look at moto: a loop device and a link for each volume attached
        to a live instance of ``devices``; the others freed."""
        found = ec2.describe_volumes(Filters=[{"Name": "tag-key", "Values": ["trainyard:volume"]}])["Volumes"]
        wanted: dict[str, str] = {}
        for volume in found:
            for attachment in volume.get("Attachments", []):
                if attachment.get("State") in ("attaching", "attached") and attachment["InstanceId"] in devices:
                    wanted[volume["VolumeId"]] = attachment["InstanceId"]
        for volume_id, (instance_id, _, _) in list(self.loops.items()):
            if wanted.get(volume_id) != instance_id:
                self.release(volume_id, machine_gone=instance_id not in devices)
        sizes = {v["VolumeId"]: int(v.get("Size", 1)) for v in found}
        for volume_id, instance_id in wanted.items():
            if volume_id not in self.loops:
                self._attach(volume_id, sizes[volume_id], instance_id, devices[instance_id])
        for image in self.root.glob("vol-*.img") if self.root.exists() else ():
            if image.stem not in sizes and image.stem not in self.loops:
                image.unlink()  # deleted in moto

    def _attach(self, volume_id: str, size_gib: int, instance_id: str, devices: Path) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        image = self.root / f"{volume_id}.img"
        if not image.exists():
            with open(image, "wb") as f:
                f.truncate(size_gib * 2**30)  # sparse: nothing is written until the job writes
        loop = subprocess.run(
            ["losetup", "--find", "--show", str(image)], capture_output=True, text=True, check=True, timeout=30
        ).stdout.strip()
        devices.mkdir(parents=True, exist_ok=True)
        link = devices / f"{self.NVME}{volume_id.replace('-', '')}"
        link.unlink(missing_ok=True)
        link.symlink_to(loop)
        self.loops[volume_id] = (instance_id, loop, link)
        self.attached.append((volume_id, instance_id))

    def release(self, volume_id: str, *, machine_gone: bool = True) -> None:
        """The volume detached, or its machine is gone: link removed, nothing
        mounted (a detach from a live machine while mounted is a fault), loop device freed."""
        instance_id, loop, link = self.loops.pop(volume_id)
        link.unlink(missing_ok=True)
        for target in mounts_of(loop):
            if not machine_gone:
                self.volume_faults.append(f"{volume_id} was detached from {instance_id} still mounted at {target}")
            subprocess.run(["umount", "-l", target], capture_output=True, check=False, timeout=30)
        subprocess.run(["losetup", "-d", loop], capture_output=True, check=False, timeout=30)

    def release_all(self) -> None:
        for volume_id in list(self.loops):
            self.release(volume_id)

    def leftovers(self) -> list[str]:
        """Loop devices still backed by one of our files, and mounts of them."""
        listed = subprocess.run(["losetup", "-a"], capture_output=True, text=True, check=False, timeout=30).stdout
        return [line for line in listed.splitlines() if str(self.root) in line]


def mounts_of(device: str) -> list[str]:
    """Where ``device`` is mounted (/proc/self/mounts)."""
    found = []
    for line in Path("/proc/self/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == device:
            found.append(parts[1].replace("\\040", " "))
    return found


def _kill_leftovers(root: Path) -> None:
    """Processes started from the instance's folder that escaped its process group (its jobs)."""
    import psutil

    for proc in psutil.process_iter():
        try:
            if any(str(root) in part for part in proc.cmdline()) or proc.cwd().startswith(str(root)):
                proc.kill()
        except psutil.Error:
            continue


@pytest.fixture
def ec2_boot(aws: MotoServer, tmp_path: Path) -> Iterator[Ec2Boot]:
    """Plays the boot of every instance of ours that moto runs during the
    test; at the end terminates what is left and kills what the boots started
    (the ``aws`` fixture then checks that nothing of ours runs)."""
    boot = Ec2Boot(aws, tmp_path / "machines").start()
    try:
        yield boot
    finally:
        left = [i["InstanceId"] for i in aws.our_instances()]
        if left:
            boot._ec2().terminate_instances(InstanceIds=left)
        boot.stop()
    leftovers = boot.volumes.leftovers()
    assert not leftovers, f"loop devices of the test's EBS volumes are left: {leftovers}"


__all__ = ["Ec2Boot", "ec2_boot"]
