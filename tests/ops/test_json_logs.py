"""TRAINYARD_LOG_FORMAT=json: one JSON object per line, from the real web
server too (docs/DEPLOY.md, "Logs"); the default stays plain text."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time

import httpx
import pytest

from backend.core.logjson import JsonFormatter
from tests.support.stack import REPO_ROOT
from tests.support.web import WebServer, WebServers

MISSING = "/api/v1/workspaces/no-such-workspace/runs/"


def test_a_record_with_an_exception_is_one_json_line() -> None:
    try:
        raise ValueError("bad\nvalue")
    except ValueError:
        record = logging.LogRecord("backend.runs", logging.ERROR, __file__, 1, "job %s failed", ("j1",), sys.exc_info())
    record.created = 1767225600.5  # 2026-01-01 00:00:00.5 UTC

    line = JsonFormatter().format(record)

    assert "\n" not in line
    entry = json.loads(line)
    assert entry.pop("exception").endswith("ValueError: bad\nvalue")
    assert entry == {
        "time": "2026-01-01T00:00:00.500+00:00",
        "level": "ERROR",
        "logger": "backend.runs",
        "message": "job j1 failed",
    }


@pytest.mark.django_db(transaction=True)
def test_the_web_server_logs_json_lines_when_asked(web_server: WebServers) -> None:
    server = web_server.start(TRAINYARD_LOG_FORMAT="json")

    assert httpx.get(f"{server.url}{MISSING}", timeout=10).status_code in (401, 403, 404)
    entries = _wait_for(server, lambda entries: any(e["logger"] == "uvicorn.access" for e in entries))

    assert {"time", "level", "logger", "message"} <= set(entries[0])
    assert any(e["logger"] == "uvicorn.access" and f"GET {MISSING} HTTP/1.1" in e["message"] for e in entries), entries
    assert any(e["logger"] == "uvicorn.error" and "Application startup complete" in e["message"] for e in entries)


@pytest.mark.django_db(transaction=True)
def test_the_web_server_logs_plain_text_by_default(web_server: WebServers) -> None:
    server = web_server.start()

    httpx.get(f"{server.url}{MISSING}", timeout=10)
    time.sleep(0.5)

    assert f"GET {MISSING} HTTP/1.1" in server.log()
    assert not server.log().lstrip().startswith("{")


def test_an_unknown_log_format_is_refused_at_start() -> None:
    env = {**os.environ, "TRAINYARD_LOG_FORMAT": "xml", "DJANGO_SETTINGS_MODULE": "backend.config.settings"}

    checked = subprocess.run(
        [sys.executable, str(REPO_ROOT / "manage.py"), "check"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip

    assert checked.returncode != 0
    assert "TRAINYARD_LOG_FORMAT='xml' is not a log format: use plain or json." in checked.stderr


def _wait_for(server: WebServer, done: object, timeout: float = 10.0) -> list[dict[str, object]]:
    assert callable(done)
    deadline = time.monotonic() + timeout
    while True:
        lines = [line for line in server.log().splitlines() if line.strip()]
        entries = [json.loads(line) for line in lines]  # every line is JSON, or this fails
        if done(entries) or time.monotonic() > deadline:
            return entries
        time.sleep(0.2)
