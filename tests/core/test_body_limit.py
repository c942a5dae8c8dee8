"""Issue 11, item 11: an oversized body without a valid credential is
refused before it is read (Django's ASGI handler would spool all of it to
disk before any view runs). Driven through the real ASGI application, with
a client that counts how much of its body the server pulled."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

from backend.accounts.models import Workspace
from backend.artifacts.storage import get_storage
from backend.config.asgi import application
from tests.support.fixtures import *  # noqa: F403 - the tenant fixtures
from tests.support.fixtures import Person

GIB = 1 << 30


class Client:
    """One HTTP request to the ASGI app; ``pulled``: body bytes the app read."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.pulled = 0
        self.sent: list[dict[str, Any]] = []

    async def receive(self) -> dict[str, Any]:
        if not self.chunks:
            await asyncio.sleep(3600)  # a client still "sending" a huge body
        chunk = self.chunks.pop(0)
        self.pulled += len(chunk)
        return {"type": "http.request", "body": chunk, "more_body": bool(self.chunks)}

    async def send(self, message: dict[str, Any]) -> None:
        self.sent.append(message)

    @property
    def status(self) -> int:
        return next(m["status"] for m in self.sent if m["type"] == "http.response.start")

    @property
    def body(self) -> Any:
        return json.loads(b"".join(m.get("body", b"") for m in self.sent if m["type"] == "http.response.body"))


def _request(method: str, path: str, headers: dict[str, str], chunks: list[bytes], timeout: float = 10) -> Client:
    client = Client(chunks)
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
        "client": ("127.0.0.1", 5000),
        "server": ("127.0.0.1", 8000),
    }

    async def go() -> None:
        task = asyncio.ensure_future(application(scope, client.receive, client.send))
        deadline = asyncio.get_running_loop().time() + timeout
        while not any(m["type"] == "http.response.body" for m in client.sent):
            assert asyncio.get_running_loop().time() < deadline, "no answer"
            await asyncio.sleep(0.01)
        task.cancel()
        # The app reached the database from asgiref's thread: close that connection.
        await sync_to_async(connections.close_all)()

    asyncio.run(go())
    return client


CHUNK = b"x" * 65536


@pytest.mark.django_db(transaction=True)
def test_an_unauthenticated_10_gib_body_is_refused_before_a_byte_is_read() -> None:
    answer = _request("POST", "/api/v1/auth/login/", {"content-length": str(10 * GIB)}, [CHUNK] * 4)
    # Within the route's cap (TRAINYARD_MAX_BODY_BYTES), above what a request without a credential may send:
    anonymous = _request("POST", "/api/v1/auth/login/", {"content-length": "200000"}, [CHUNK] * 4)

    assert (answer.status, answer.pulled) == (413, 0)
    assert answer.body == {
        "message": "The request body declares 10,737,418,240 bytes; this endpoint takes 1,048,576 at most.",
        "extra": {"limit_bytes": 1 << 20},
    }
    assert (anonymous.status, anonymous.pulled) == (413, 0)
    assert anonymous.body == {
        "message": "A request without a valid API token, runner token or session may send at most 65,536 bytes: "
        "sign in or pass your token (Authorization: Bearer …).",
        "extra": {"limit_bytes": 65536},
    }


@pytest.mark.django_db(transaction=True)
def test_a_made_up_token_does_not_get_a_large_body_read(team: Workspace) -> None:
    headers = {"content-length": str(GIB), "authorization": "Bearer not-a-real-token"}
    answer = _request("POST", f"/api/v1/workspaces/{team.slug}/blobs/", headers, [CHUNK] * 4)

    assert (answer.status, answer.pulled) == (413, 0)


@pytest.mark.django_db(transaction=True)
def test_a_chunked_unauthenticated_body_is_cut_off_at_the_limit() -> None:
    answer = _request("POST", "/api/v1/auth/login/", {"transfer-encoding": "chunked"}, [CHUNK] * 100)

    assert answer.status == 413
    assert answer.pulled == 2 * len(CHUNK)  # the first chunk past 64 KiB, not the 6.5 MB sent


@pytest.mark.django_db(transaction=True)
def test_a_signed_in_client_is_let_through_to_the_endpoints_own_limits(
    team: Workspace, owner: Person, settings: Any, tmp_path: Path
) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "STORAGE_DIR": tmp_path}
    data = b"a code archive" * 10_000
    headers = {
        "content-length": str(len(data)),
        "authorization": f"Bearer {owner.token}",
        "content-type": "application/octet-stream",
    }
    answer = _request("POST", f"/api/v1/workspaces/{team.slug}/blobs/", headers, [data])

    assert answer.status == 201, answer.body
    assert answer.body["size"] == len(data)


@pytest.mark.django_db(transaction=True)
def test_a_storage_put_larger_than_its_link_is_refused_before_it_is_read(settings: Any, tmp_path: Path) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "STORAGE_DIR": tmp_path}
    data = b"the model"
    target = get_storage().upload_target("ws/x/m.bin", sha256=hashlib.sha256(data).hexdigest(), size=9, seconds=60)
    path = urlsplit(target.url).path

    big = _request("PUT", path, {"content-length": str(GIB)}, [CHUNK])
    chunked = _request("PUT", path, {"transfer-encoding": "chunked"}, [data, b"and then some"])
    forged = _request("PUT", "/storage/forged-token", {"content-length": str(GIB)}, [CHUNK])
    fits = _request("PUT", path, {"content-length": "9"}, [data])

    assert (big.status, big.pulled) == (413, 0)
    assert big.body["extra"] == {"limit_bytes": 9}
    assert chunked.status == 413
    assert (forged.status, forged.pulled, forged.body["message"]) == (403, 0, "This link is not valid.")
    assert fits.status == 201, fits.body
    assert get_storage().size("ws/x/m.bin") == 9


@pytest.mark.django_db(transaction=True)
def test_a_signed_in_client_is_held_to_each_routes_cap_before_a_byte_is_read(
    team: Workspace, owner: Person, settings: Any
) -> None:
    """Issue 33, item 1: a credential no longer lifts the cap; each route has its own."""
    settings.TRAINYARD = {**settings.TRAINYARD, "MAX_BLOB_BYTES": 4 * len(CHUNK)}
    signed_in = {"authorization": f"Bearer {owner.token}"}

    json_route = _request("POST", "/api/v1/tokens/", {**signed_in, "content-length": str(GIB)}, [CHUNK])
    blobs = _request(
        "POST", f"/api/v1/workspaces/{team.slug}/blobs/", {**signed_in, "content-length": str(GIB)}, [CHUNK]
    )
    chunked = _request("POST", "/api/v1/tokens/", {**signed_in, "transfer-encoding": "chunked"}, [CHUNK] * 100)

    assert (json_route.status, json_route.pulled) == (413, 0)
    assert json_route.body == {
        "message": f"The request body declares {GIB:,} bytes; this endpoint takes 1,048,576 at most.",
        "extra": {"limit_bytes": 1 << 20},
    }
    assert (blobs.status, blobs.pulled, blobs.body["extra"]) == (413, 0, {"limit_bytes": 4 * len(CHUNK)})
    assert chunked.status == 413
    assert chunked.pulled == (1 << 20) + len(CHUNK)  # the first chunk past 1 MiB, not the 6.5 MB sent


def test_routes_have_their_caps(settings: Any) -> None:
    from backend.config.body_limit import route_cap

    limits = settings.TRAINYARD
    assert route_cap("/api/v1/workspaces/acme/blobs/") == limits["MAX_BLOB_BYTES"]
    assert route_cap("/api/v1/workspaces/acme/runs/") == limits["MAX_MANIFEST_BODY_BYTES"]
    assert route_cap("/api/v1/workspaces/acme/runs/plan/") == limits["MAX_MANIFEST_BODY_BYTES"]
    job = "/api/v1/runner/jobs/6f1c2a51-0000-4000-8000-000000000000"
    for path in (f"{job}/artifacts/", f"{job}/checkpoints/", f"{job}/caches/", f"{job}/artifacts/a1/parts/"):
        assert route_cap(path) == limits["MAX_MANIFEST_BODY_BYTES"], path
    for path in ("/api/v1/auth/login/", "/api/v1/workspaces/acme/secrets/X/", "/api/v1/workspaces/acme/runs/r/"):
        assert route_cap(path) == limits["MAX_BODY_BYTES"], path
