"""Notifications end to end: a webhook receiver the test starts gets a
local run's ``run.succeeded`` once, signed so that the documented check
(docs/examples/verify_webhook.py) accepts it; the delivery log says so
(real stack: web, Celery worker, runner)."""

from __future__ import annotations

import http.server
import importlib.util
import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import User, run_name_of
from tests.support.stack import Stack

SNIPPET = Path(__file__).resolve().parents[2] / "docs" / "examples" / "verify_webhook.py"


class Receiver:
    def __init__(self) -> None:
        self.got: list[tuple[dict[str, str], bytes]] = []
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
                receiver.got.append((dict(self.headers.items()), body))
                self.send_response(204)
                self.end_headers()

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/trainyard"

    def wait_for(self, count: int, timeout: float = 60) -> list[tuple[dict[str, str], bytes]]:
        deadline = time.monotonic() + timeout
        while len(self.got) < count:
            assert time.monotonic() < deadline, f"the receiver got {len(self.got)} deliveries, expected {count}"
            time.sleep(0.2)
        return self.got


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    started = Receiver()
    threading.Thread(target=started.server.serve_forever, daemon=True).start()
    yield started
    started.server.shutdown()
    started.server.server_close()


def _documented_verify() -> Any:
    spec = importlib.util.spec_from_file_location("verify_webhook", SNIPPET)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.verify


def test_a_webhook_gets_the_runs_success_signed(stack: Stack, repo: Path, receiver: Receiver) -> None:
    nadia = User("nadia", stack.issue_token("nadia"), stack)
    notifications = f"/api/v1/workspaces/{nadia.workspace}/notifications/"
    created = nadia.api(
        "POST",
        notifications,
        json={"kind": "webhook", "target": receiver.url, "events": ["run.succeeded", "run.failed"]},
    )
    assert created.status_code == 201, created.text
    secret = created.json()["secret"]

    name = run_name_of(nadia.cli(repo, "run", "hello", "-d"))
    assert nadia.wait(name, lambda r: r["status"] in {"succeeded", "failed", "stopped"})["status"] == "succeeded"

    ((headers, body),) = receiver.wait_for(1)
    assert headers["Trainyard-Event"] == "run.succeeded"
    assert _documented_verify()(secret, body, headers["Trainyard-Signature"])
    payload = json.loads(body)
    assert (payload["type"], payload["workspace"]) == ("run.succeeded", nadia.workspace)
    assert (payload["data"]["run"]["name"], payload["data"]["run"]["status"]) == (name, "succeeded")
    log = nadia.api("GET", f"{notifications}{created.json()['id']}/deliveries/").json()
    assert [(d["event_type"], d["status"], d["attempts"], d["last_status_code"]) for d in log] == [
        ("run.succeeded", "delivered", 1, 204)
    ]
    assert log[0]["id"] == headers["Trainyard-Delivery"]
    time.sleep(2)  # nothing else follows: one event per run end
    assert len(receiver.got) == 1
