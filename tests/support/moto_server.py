"""moto's standalone server with EC2 fault injection and S3's expiry of
presigned URLs: ``python -m tests.support.moto_server -p PORT``.

moto has no error injection, so this wrapper wraps a few of
moto's EC2 response handlers before calling ``moto.server.main()``. Each call
reads the JSON fault list at ``$TRAINYARD_MOTO_FAULTS`` (written by
``MotoServer.fault`` in tests/support/moto.py); the first fault whose action
and ``when`` match answers with the real EC2 error shape (HTTP 400, the given
code and message) and counts down its ``times``. A fault with a ``delay``
sleeps that many seconds first; with an empty code it then lets the call
through (a slow call: EC2 still performs it if the client has gone away).
``when`` matches a parameter's value, an item of a list parameter
(``InstanceIds``), or, for ``Filter.Name``, one of the request's filter names.

moto does not check presigned URLs the way S3 does; the wrapper does, for
any request signed in its query: past ``X-Amz-Date`` + ``X-Amz-Expires``, it
answers HTTP 403 AccessDenied "Request has expired"; with an Authorization
header as well (a client that sent its own token along), HTTP 400 "Only one
auth mechanism allowed". A fault with action ``PresignedRequest`` and
``when`` on ``method`` (GET, PUT) and ``part`` ("yes" for a multipart part)
refuses the next ``times`` matching presigned requests as expired (a URL
signed again in the same second is the same URL, so the fault counts
requests, not URLs: tests check that a fresh URL was asked for on the
server's side).

Two EC2 behaviours moto lacks are added, because the backend's contract
depends on them (tests/clouds/test_contract.py on ``aws``):

- ``ClientToken``: a RunInstances whose token an earlier call already used
  answers that call's reservation instead of launching again, as EC2 does
  (moto ignores the token: two calls, two instances). Calls are serialised
  for this, so concurrent launches with one token start one instance.
- a slow terminate: with ``terminate_delay`` set in the behaviour file
  (``$TRAINYARD_MOTO_BEHAVIOUR``, written by ``MotoServer.slow_terminate``),
  a terminated instance stays ``shutting-down`` until a TerminateInstances
  at least that many seconds after the first (moto terminates at once).

With ``$TRAINYARD_MOTO_REQUEST_LOG`` set (``MotoServer(log_requests=True)``),
each call of an EC2 action above appends one JSON line to that file:
action, region, ``received`` and ``answered`` (``time.time()`` on arrival at
moto and when its answer was ready) and the error code, if any. The
benchmark times the launch from it (bench/README.md). Every presigned S3
request is logged too, as action ``presigned GET`` (or PUT…) with its
``path`` (``/bucket/key``): what a runner downloaded.

Everything else is moto.
"""

from __future__ import annotations

import copy
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
from moto.ec2.models.instances import Instance, InstanceBackend
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
    "AttachVolume",
)

_lock = threading.Lock()
_launch_lock = threading.Lock()
MOTO_DEFAULT_TOKEN = "ABCDE"  # what moto's response handler passes when the request has no ClientToken


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
            if not all(_matches(params(key), value) for key, value in (fault.get("when") or {}).items()):
                continue
            fault["times"] = fault.get("times", 1) - 1
            fault["hits"] = fault.get("hits", 0) + 1
            file.write_text(json.dumps(faults))
            return fault
    return None


def _matches(actual: Any, wanted: Any) -> bool:
    """A request parameter matches a ``when`` value: equal, or (a list such
    as DescribeInstances' ``InstanceIds``) holding it."""
    if isinstance(actual, list | tuple):
        return str(wanted) in {str(item) for item in actual} or str(actual) == str(wanted)
    return str(actual) == str(wanted)


def _param(response: EC2Response, key: str) -> Any:
    """A request parameter for ``when``; ``Filter.Name``: the names of the
    request's filters (``tag:trainyard:key`` for a look-up by key)."""
    if key == "Filter.Name":
        return list(response._filters_from_querystring())
    return response._get_param(key)


def _wrap(action: str) -> None:
    name = _underscored(action)
    original = getattr(EC2Response, name)

    def handler(self: EC2Response) -> Any:
        received = time.time()
        error = ""
        try:
            fault = _matching_fault(action, lambda key: _param(self, key))
            if fault is not None:
                if fault.get("delay"):
                    # The call takes this long, and then happens all the same,
                    # even when the client is gone by then (EC2 does not notice).
                    time.sleep(float(fault["delay"]))
                if fault.get("code"):
                    error = fault["code"]
                    raise EC2ClientError(
                        fault["code"], fault.get("message") or f"{fault['code']} (injected by the test)"
                    )
            return original(self)
        except Exception as e:
            error = error or str(getattr(e, "code", "") or type(e).__name__)
            raise
        finally:
            _log_request(action, getattr(self, "region", ""), received, error)

    handler.__name__ = name
    setattr(EC2Response, name, handler)


def _log_request(action: str, region: str, received: float, error: str, **more: str) -> None:
    path = os.environ.get("TRAINYARD_MOTO_REQUEST_LOG")
    if not path:
        return
    line = {"action": action, "region": region, "received": received, "answered": time.time(), "error": error, **more}
    with _lock, open(path, "a") as file:
        file.write(json.dumps(line) + "\n")


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
        _log_request(f"presigned {facts['method']}", "", time.time(), "", path=environ.get("PATH_INFO", ""))
        if _expired(query) or _matching_fault("PresignedRequest", facts.get) is not None:
            _drain(environ)  # a client still sending its body must read the answer, not a reset
            return _answer(start_response, "403 Forbidden", _EXPIRED)
        return original(self, environ, start_response)  # type: ignore[no-any-return]

    DomainDispatcherApplication.__call__ = call  # type: ignore[method-assign]


def _behaviour() -> dict[str, Any]:
    path = os.environ.get("TRAINYARD_MOTO_BEHAVIOUR")
    try:
        return dict(json.loads(Path(path).read_text() or "{}")) if path else {}
    except FileNotFoundError:
        return {}


def _honour_client_token() -> None:
    original = InstanceBackend.run_instances

    def run_instances(self: InstanceBackend, *args: Any, **kwargs: Any) -> Any:
        token = kwargs.get("client_token")
        if not token or token == MOTO_DEFAULT_TOKEN:
            return original(self, *args, **kwargs)
        with _launch_lock:
            for reservation in self.reservations.values():
                if any(instance.client_token == token for instance in reservation.instances):
                    return reservation
            return original(self, *args, **kwargs)

    InstanceBackend.run_instances = run_instances  # type: ignore[method-assign]


def _slow_terminate() -> None:
    """With a delay, TerminateInstances makes an instance ``shutting-down``
    and a TerminateInstances at least ``delay`` seconds later ``terminated``
    (only calls change the state, so a test never races a timer). Its answer
    reports the instance's real state (moto always says ``shutting-down``)."""
    original = Instance.terminate

    def terminate(self: Instance) -> Any:
        delay = float(_behaviour().get("terminate_delay") or 0)
        if not delay:
            return original(self)
        previous = copy.copy(self._state)
        asked = getattr(self, "_trainyard_terminate_asked", None)
        if self._state.name == "terminated":
            return previous
        if asked is None:
            self._trainyard_terminate_asked = time.monotonic()
            self._state.name, self._state.code = "shutting-down", 32
        elif time.monotonic() - asked >= delay:
            original(self)
        return previous

    Instance.terminate = terminate  # type: ignore[method-assign]
    respond = EC2Response.terminate_instances

    def terminate_instances(self: EC2Response) -> Any:
        answer = respond(self)
        for item in answer.result["TerminatingInstances"]:
            state = self.ec2_backend.get_instance(item["InstanceId"])._state
            item["CurrentState"] = {"Code": state.code, "Name": state.name}
        return answer

    EC2Response.terminate_instances = terminate_instances  # type: ignore[method-assign]


def main() -> None:
    for action in ACTIONS:
        _wrap(action)
    _enforce_presigned_expiry()
    _honour_client_token()
    _slow_terminate()
    from moto.server import main as moto_main

    moto_main(sys.argv[1:])


if __name__ == "__main__":
    main()
