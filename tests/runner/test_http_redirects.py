"""The runner's token never follows a redirect: a call that carries it is
refused when answered with one, and the place it points to never sees it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from trainyard_runner.http import HttpError, get_json, open_get, post_json

TOKEN = "tyrun_the-runners-own-token.job-token"


class _Server:
    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self.seen: list[dict[str, str]] = []
        seen = self.seen

        class Recording(handler):  # type: ignore[misc, valid-type]
            def log_message(self, *args: Any) -> None:
                pass

            def parse_request(self) -> bool:
                parsed: bool = super().parse_request()
                if parsed:  # recorded before any answer is sent
                    seen.append(dict(self.headers))
                return parsed

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Recording)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()


class _Elsewhere(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    do_POST = do_GET


@pytest.fixture
def servers() -> Iterator[tuple[_Server, _Server]]:
    elsewhere = _Server(_Elsewhere)
    target = elsewhere.url

    class Redirecting(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", f"{target}/stolen")
            self.end_headers()

        do_POST = do_GET

    api = _Server(Redirecting)
    yield api, elsewhere
    api.close()
    elsewhere.close()


def test_a_call_with_the_token_is_refused_on_a_redirect_and_the_token_never_reaches_the_other_origin(
    servers: tuple[_Server, _Server],
) -> None:
    api, elsewhere = servers

    with pytest.raises(HttpError) as got:
        get_json(f"{api.url}/api/v1/runner/jobs/x/secrets/?attempt=1", token=TOKEN)
    with pytest.raises(HttpError) as posted:
        post_json(f"{api.url}/api/v1/runner/jobs/x/artifacts/?attempt=1", {"path": "m"}, token=TOKEN)

    host = elsewhere.url.removeprefix("http://")
    for refused in (got.value, posted.value):
        assert refused.status == 302 and not refused.recoverable
        assert f"redirected to {host}: a call carrying the runner's token does not follow redirects" in str(refused)
    assert elsewhere.seen == []


def test_a_signed_url_without_the_token_still_follows_its_redirect(servers: tuple[_Server, _Server]) -> None:
    api, elsewhere = servers

    with open_get(f"{api.url}/storage/signed") as answer:
        body = answer.read()

    assert body == b"{}" and len(elsewhere.seen) == 1 and "Authorization" not in elsewhere.seen[0]
