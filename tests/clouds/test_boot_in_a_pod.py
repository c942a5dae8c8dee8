"""The boot script (backend/clouds/bootstrap/user-data.sh) as a pod's
command under the kubelet helper: in the foreground mode a container uses,
the pod's SIGTERM, which goes to the container's main process only, reaches
the runner, and the pod ends when the runner has, well within its grace.

The runner here is a stand-in installed from a small wheel index exactly as
the boot script installs the real one (the real runner and server: part of
tests/e2e/test_kubernetes.py); it notes its arguments, its environment and
the SIGTERM it gets."""

from __future__ import annotations

import base64
import hashlib
import subprocess
import sys
import threading
import time
import zipfile
from collections.abc import Iterator
from functools import partial
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from backend.clouds.services.bootstrap import user_data
from tests.support.kubeapi import NAMESPACE, KubeApi
from tests.support.kubelet import Kubelet
from tests.support.waiting import wait_for

STAND_IN = """
import os, pathlib, signal, sys, time

def main():
    mark = pathlib.Path(os.environ["MARK"])
    def term(signum, frame):
        with open(mark / "term", "a") as f:
            f.write("TERM\\n")
        sys.exit(0)
    signal.signal(signal.SIGTERM, term)
    seen = [" ".join(sys.argv[1:]), os.environ.get("TRAINYARD_RUNNER_CLOUD", ""),
            os.environ.get("TRAINYARD_RUNNER_TERMINATION_GRACE", "")]
    (mark / "started").write_text("\\n".join(seen) + "\\n")
    while True:
        time.sleep(0.1)
"""


def _stand_in_wheel(folder: Path) -> Path:
    """``trainyard-runner`` whose console script is ``STAND_IN``'s main."""
    dist = "trainyard_runner-0.0.0.dist-info"
    files = {
        "stand_in_runner.py": STAND_IN.encode(),
        f"{dist}/METADATA": b"Metadata-Version: 2.1\nName: trainyard-runner\nVersion: 0.0.0\n",
        f"{dist}/WHEEL": b"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{dist}/entry_points.txt": b"[console_scripts]\ntrainyard-runner = stand_in_runner:main\n",
    }
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{name},sha256={digest},{len(data)}")
    record.append(f"{dist}/RECORD,,")
    path = folder / "trainyard_runner-0.0.0-py3-none-any.whl"
    with zipfile.ZipFile(path, "w") as wheel:
        for name, data in files.items():
            wheel.writestr(name, data)
        wheel.writestr(f"{dist}/RECORD", "\n".join(record) + "\n")
    return path


@pytest.fixture
def wheels_server(tmp_path: Path) -> Iterator[str]:
    """A server whose ``/runner/wheels/`` lists a pip wheel and the stand-in runner, as the server's does."""
    wheels = tmp_path / "site" / "runner" / "wheels"
    wheels.mkdir(parents=True)
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(wheels), "pip"],
        check=True,
        capture_output=True,
        timeout=120,
    )
    _stand_in_wheel(wheels)
    links = []
    for wheel in sorted(wheels.glob("*.whl")):
        links.append(f'<a href="{wheel.name}#sha256={hashlib.sha256(wheel.read_bytes()).hexdigest()}">{wheel.name}</a>')
    (wheels / "index.html").write_text("<html><body>\n" + "\n".join(links) + "\n</body></html>\n")

    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), partial(Quiet, directory=str(tmp_path / "site")))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_the_pods_sigterm_reaches_the_runner_through_the_boot_script_and_the_pod_ends_with_it(
    kube_api: KubeApi, kubelet: Kubelet, wheels_server: str, tmp_path: Path
) -> None:
    mark = tmp_path / "mark"
    mark.mkdir()
    script = user_data(server_url=wheels_server, instance_name="ty-boot", bootstrap_token="tok", cloud="kubernetes")
    env = {
        "TRAINYARD_BOOT_FOREGROUND": "1",
        "TRAINYARD_POWER_OFF_COMMAND": "true",
        "TRAINYARD_RUNNER_TERMINATION_GRACE": "30",
        "MARK": str(mark),
    }
    kubelet.add_node("node-1")
    kube_api.post(
        f"/api/v1/namespaces/{NAMESPACE}/pods",
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "ty-boot", "namespace": NAMESPACE},
            "spec": {
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 30,
                "containers": [
                    {
                        "name": "runner",
                        "image": "python:3.12-slim",
                        "command": ["/bin/sh", "-c", script],
                        "env": [{"name": k, "value": v} for k, v in env.items()],
                    }
                ],
            },
        },
    )
    wait_for("the runner's start", lambda: (mark / "started").exists(), 90, lambda: kubelet.pod_log("ty-boot")[-2000:])
    assert (mark / "started").read_text().splitlines() == ["--give-up-after 0", "kubernetes", "30"]

    kube_api.delete(f"/api/v1/namespaces/{NAMESPACE}/pods/ty-boot")
    deleted = time.monotonic()
    wait_for("the runner's SIGTERM", lambda: (mark / "term").exists(), 10, lambda: kubelet.pod_log("ty-boot")[-2000:])
    kubelet.wait_gone("ty-boot", 10)
    assert time.monotonic() - deleted < 5.0, "the pod ended with its runner, not at the end of its grace"
    assert (mark / "term").read_text() == "TERM\n", "the runner got one SIGTERM"
    log = kubelet.pod_log("ty-boot")
    assert "running the runner in the foreground" in log
    assert "powering off" not in log, "a stopped pod is not a runner that gave up"
