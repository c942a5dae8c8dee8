"""Providers end to end: the example cluster plugin and the python provider."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.conftest import User, commit_all
from tests.support.pkgindex import build_wheel

CLUSTER = """workflows:
  - name: cluster
    provider: cluster
    workers: 2
    port: {port}
    master:
      - python master.py
    worker:
      - python worker.py
"""
MASTER = """import os, socket
port = int(os.environ["MASTER_PORT"])
with socket.create_server(("0.0.0.0", port)) as server:
    print(f"master listening on {port}", flush=True)
    for _ in range(2):
        conn, _ = server.accept()
        with conn:
            print(f"master: {conn.recv(100).decode()} connected", flush=True)
"""
WORKER = """import os, socket, time
host, port = os.environ["TRAINYARD_MASTER_HOST"], int(os.environ["TRAINYARD_MASTER_PORT"])
for attempt in range(100):
    try:
        with socket.create_connection((host, port), timeout=2) as conn:
            conn.sendall(f"worker-{os.environ['WORKER_INDEX']}".encode())
            break
    except OSError:
        time.sleep(0.1)
print("worker done", flush=True)
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_the_cluster_plugin_runs_a_master_and_two_workers_that_connect(alice: User, repo: Path) -> None:
    (repo / ".trainyard" / "workflows.yaml").write_text(CLUSTER.format(port=_free_port()))
    (repo / "master.py").write_text(MASTER)
    (repo / "worker.py").write_text(WORKER)

    result = alice.cli(repo, "run", "cluster", timeout=180)

    assert result.returncode == 0, result.stderr
    name = result.stderr.split("Run ", 1)[1].split()[0]
    jobs = {j["name"]: j for j in alice.run(name)["jobs"]}
    assert sorted(jobs) == ["cluster-master", "cluster-worker-1", "cluster-worker-2"]
    assert all(j["status"] == "succeeded" for j in jobs.values())
    master_lines = [line for line in result.stdout.splitlines() if line.startswith("[cluster-master]")]
    assert sorted(line.split("master: ")[1] for line in master_lines if "connected" in line) == [
        "worker-1 connected",
        "worker-2 connected",
    ]


def test_the_python_provider_installs_requirements_into_its_environment(alice: User, repo: Path) -> None:
    wheel = build_wheel(repo / "wheels", "tinyhello", "0.1", "def greet():\n    return 'hello from a wheel'\n")
    (repo / "requirements.txt").write_text(f"./wheels/{wheel.name}\n")
    (repo / "use_pkg.py").write_text(
        "import os, sys, tinyhello\nprint(tinyhello.greet(), sys.prefix == os.environ['VIRTUAL_ENV'])\n"
    )
    (repo / ".trainyard" / "workflows.yaml").write_text(
        "workflows:\n  - name: py\n    provider: python\n    script: use_pkg.py\n    requirements: requirements.txt\n"
    )
    commit_all(repo, "python workflow")

    result = alice.cli(repo, "run", "py", timeout=180)

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == "hello from a wheel True"
