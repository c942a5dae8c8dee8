"""Signing the CLI in through the browser: RFC 8628's device authorization
grant against ``/api/v1/auth/device/`` (docs/API.md, "Signing in from the
CLI"). ``start`` asks for a code; ``wait_for_token`` polls until the person
approves or denies it on the dashboard, or it expires."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import httpx

from . import __version__
from .api import TIMEOUT, ApiError, _error_from, _transport_errors

# The longest wait between polls, whatever the server asks (it asks 5 s, plus 5 s per ``slow_down``).
MAX_INTERVAL_SECONDS = 60


@dataclass(frozen=True)
class DeviceCode:
    device_code: str
    user_code: str
    verification_uri: str
    verification_uri_complete: str
    expires_in: int
    interval: int


@dataclass(frozen=True)
class DeviceToken:
    token: str
    username: str
    expires_at: str


class DeviceLoginFailed(ApiError):
    """The sign-in ended without a token (denied, expired, unknown code); ``error`` is RFC 8628's code."""

    def __init__(self, error: str, message: str) -> None:
        super().__init__(message, status=400)
        self.error = error


def start(url: str, *, client_name: str) -> DeviceCode:
    answer = _post(url, "/api/v1/auth/device/", {"client_name": client_name[:100]})
    return DeviceCode(**{name: answer[name] for name in DeviceCode.__dataclass_fields__})


def wait_for_token(url: str, code: DeviceCode) -> DeviceToken:
    """Poll every ``interval`` seconds (longer when told ``slow_down``) until
    a token comes; ``DeviceLoginFailed`` when it will not."""
    interval = code.interval
    deadline = time.monotonic() + code.expires_in + interval
    while True:
        time.sleep(interval)
        try:
            answer = _post(url, "/api/v1/auth/device/token/", {"device_code": code.device_code}, grant=True)
        except ApiError as e:
            if (e.status is not None and e.status < 500) or time.monotonic() > deadline:
                raise
            continue  # the server's hiccup: the next poll asks again
        error = answer.get("error")
        if error is None:
            return DeviceToken(token=answer["token"], username=answer["username"], expires_at=answer["expires_at"])
        if error not in ("authorization_pending", "slow_down"):
            raise DeviceLoginFailed(str(error), str(answer.get("message") or error))
        interval = min(int(answer.get("interval") or interval), MAX_INTERVAL_SECONDS)
        if time.monotonic() > deadline:  # the server should have said expired_token by now
            raise DeviceLoginFailed("expired_token", f"the code {code.user_code} was not approved in time")


def _post(url: str, path: str, body: dict[str, Any], *, grant: bool = False) -> dict[str, Any]:
    """POST ``body``; with ``grant``, a 400 carrying RFC 8628's ``error`` is an answer, not a failure."""
    headers = {"User-Agent": f"trainyard-cli/{__version__}"}
    with _transport_errors(url), httpx.Client(base_url=url, headers=headers, timeout=TIMEOUT) as http:
        response = http.post(path, json=body)
    if grant and response.status_code == 400:
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if isinstance(answer, dict) and isinstance(answer.get("error"), str):
            return answer
    if response.status_code >= 400:
        raise _error_from(response)
    try:
        answer = response.json()
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        raise ApiError(f"the server answered POST {path} with something that is not a JSON object")
    return answer
