"""moto's standalone server with EC2 fault injection and S3's expiry of
presigned URLs: ``python -m tests.support.moto_server -p PORT``.

moto has no error injection (shared/STACK.md), so this wrapper wraps a few of
moto's EC2 response handlers before calling ``moto.server.main()``. Each call
reads the JSON fault list at ``$TRAINYARD_MOTO_FAULTS`` (written by
``MotoServer.fault`` in tests/support/moto.py); the first fault whose action
and ``when`` match answers with the real EC2 error shape (HTTP 400, the given
code and message) and counts down its ``times``.

moto does not check presigned URLs the way S3 does; the wrapper does, for
any request signed in its query: past ``X-Amz-Date`` + ``X-Amz-Expires``, it
answers HTTP 403 AccessDenied "Request has expired"; with an Authorization
header as well (a client that sent its own token along), HTTP 400 "Only one
auth mechanism allowed". A fault with action ``PresignedRequest`` and
``when`` on ``method`` (GET, PUT) and ``part`` ("yes" for a multipart part)
refuses the next ``times`` matching presigned requests as expired (a URL
signed again in the same second is the same URL, so the fault counts
requests, not URLs: tests check that a fresh URL was asked for on the
server's side). Everything else is moto.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from calendar import timegm
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

from moto.ec2.exceptions import EC2ClientError
from moto.ec2.responses import EC2Response

# The EC2 actions a fault may name (the API's own names).
ACTIONS = (
    "RunInstances",
    "DescribeInstances",
    "TerminateInstances",
    "DescribeInstanceTypes",
    "DescribeInstanceTypeOfferings",
    "DescribeSpotPriceHistory",
    "CreateSecurityGroup",
    "DescribeSecurityGroups",
    "DescribeVpcs",
    "DescribeSubnets",
    "DescribeImages",
    "CreateTags",
)

_lock = threading.Lock()


def _underscored(action: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in action).lstrip("_")


def _matching_fault(action: str, params: Callable[[str], Any]) -> dict[str, Any] | None:
    path = os.environ.get("TRAINYARD_MOTO_FAULTS")
    if not path:
        return None
    with _lock:
        file = Path(path)
        try:
            faults: list[dict[str, Any]] = json.loads(file.read_text() or "[]")
        except FileNotFoundError:
            return None
        for fault in faults:
            if fault["action"] != action or fault.get("times", 1) <= 0:
                continue
            if any(str(params(key)) != str(value) for key, value in (fault.get("when") or {}).items()):
                continue
            fault["times"] = fault.get("times", 1) - 1
            fault["hits"] = fault.get("hits", 0) + 1
            file.write_text(json.dumps(faults))
            return fault
    return None


def _wrap(action: str) -> None:
    name = _underscored(action)
    original = getattr(EC2Response, name)

    def handler(self: EC2Response) -> Any:
        fault = _matching_fault(action, self._get_param)
        if fault is not None:
            raise EC2ClientError(fault["code"], fault.get("message") or f"{fault['code']} (injected by the test)")
        return original(self)

    handler.__name__ = name
    setattr(EC2Response, name, handler)


_EXPIRED = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>AccessDenied</Code>'
    b"<Message>Request has expired</Message></Error>"
)
_TWO_AUTHS = (
    b'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>InvalidArgument</Code>'
    b"<Message>Only one auth mechanism allowed</Message></Error>"
)


def _expired(query: str) -> bool:
    params = parse_qs(query)
    date, expires = params.get("X-Amz-Date", [""])[0], params.get("X-Amz-Expires", [""])[0]
    if not date or not expires.isdigit():
        return False
    signed_at = timegm(time.strptime(date, "%Y%m%dT%H%M%SZ"))
    return time.time() > signed_at + int(expires)


def _drain(environ: dict[str, Any]) -> None:
    left = int(environ.get("CONTENT_LENGTH") or 0)
    stream = environ["wsgi.input"]
    while left > 0 and (chunk := stream.read(min(left, 1 << 20))):
        left -= len(chunk)


def _answer(start_response: Any, status: str, body: bytes) -> list[bytes]:
    start_response(status, [("Content-Type", "application/xml"), ("Content-Length", str(len(body)))])
    return [body]


def _enforce_presigned_expiry() -> None:
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    original = DomainDispatcherApplication.__call__

    def call(self: Any, environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
        query = environ.get("QUERY_STRING", "")
        if "X-Amz-Signature=" not in query:
            return original(self, environ, start_response)  # type: ignore[no-any-return]
        if environ.get("HTTP_AUTHORIZATION"):
            _drain(environ)
            return _answer(start_response, "400 Bad Request", _TWO_AUTHS)
        facts = {"method": environ.get("REQUEST_METHOD", ""), "part": "yes" if "partNumber=" in query else "no"}
        if _expired(query) or _matching_fault("PresignedRequest", facts.get) is not None:
            _drain(environ)  # a client still sending its body must read the answer, not a reset
            return _answer(start_response, "403 Forbidden", _EXPIRED)
        return original(self, environ, start_response)  # type: ignore[no-any-return]

    DomainDispatcherApplication.__call__ = call  # type: ignore[method-assign]


def main() -> None:
    for action in ACTIONS:
        _wrap(action)
    _enforce_presigned_expiry()
    from moto.server import main as moto_main

    moto_main(sys.argv[1:])


if __name__ == "__main__":
    main()
