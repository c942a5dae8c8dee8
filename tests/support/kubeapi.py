"""A Kubernetes API server for tests: kmock's ``KubernetesEmulator`` on
127.0.0.1, in a thread with its own event loop, spoken to over real HTTP.

kmock keeps objects in memory and serves discovery, create, get, list,
merge-patch, delete and watch. It does not schedule or run pods (the
``kubelet`` helper, tests/support/kubelet.py, plays that), and it ignores
label and field selectors: clients filter by labels themselves, as the
Kubernetes backend does. What this wrapper adds, as the real API server
does on its own:

- on create: ``metadata.uid``, ``creationTimestamp``, ``resourceVersion``,
  and a new pod's ``status.phase: Pending``;
- namespaces (kmock cannot parse their paths): get, list, create, delete;
- ``SelfSubjectAccessReview``: answered, not stored, ``allowed`` unless the
  test listed the verb and resource in ``denied`` (``deny("create", "pods")``);
- a bearer token: a request without ``Authorization: Bearer <token>``
  is answered 401, as a cluster answers a wrong or expired token.

``KubeApi.kubeconfig()`` is a kubeconfig for it (a token user, http);
``get``/``post``/``patch``/``delete`` are the test's own calls, for setting
up nodes or playing the cluster's side, over the same HTTP.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import re
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from typing import Any

import aiohttp.web
import pytest
import yaml
from kmock import KubernetesEmulator, ResourceInfo, Server

TOKEN = "kube-test-token"
SSAR_PATH = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
_NAMESPACE_PATH = re.compile(r"/api/v1/namespaces(?:/([^/]+))?/?")
NAMESPACE = "trainyard"


class _Cluster(KubernetesEmulator):
    """The emulator plus what the API server itself would do (module docstring)."""

    def __init__(self, api: KubeApi) -> None:
        super().__init__()
        self._api = api
        self._version = 0

    async def __call__(self, raw: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        if self._api.token and raw.headers.get("Authorization") != f"Bearer {self._api.token}":
            return _status(401, "Unauthorized", "Unauthorized")
        if raw.path == SSAR_PATH and raw.method == "POST":
            return self._access_review(await raw.json())
        namespace = _NAMESPACE_PATH.fullmatch(raw.path)
        if namespace is not None:  # kmock cannot parse these paths: served here
            return await self._namespace(raw, namespace.group(1))
        return await super().__call__(raw)

    async def _handle(self, request: Any) -> aiohttp.web.StreamResponse:
        from kmock import action

        if request.action == action.CREATE and isinstance(request.data, dict):
            self._stamp(request.data)
        return await super()._handle(request)

    async def _namespace(self, raw: aiohttp.web.BaseRequest, name: str | None) -> aiohttp.web.StreamResponse:
        namespaces = self._api.namespaces
        if raw.method == "GET" and name is None:
            items = [{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": n}} for n in sorted(namespaces)]
            return aiohttp.web.json_response({"apiVersion": "v1", "kind": "NamespaceList", "items": items})
        if raw.method == "GET" and name is not None:
            if name not in namespaces:
                return _status(404, "NotFound", f'namespaces "{name}" not found')
            return aiohttp.web.json_response({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        if raw.method == "POST" and name is None:
            body = await raw.json()
            new = str(body.get("metadata", {}).get("name", ""))
            if new in namespaces:
                return _status(409, "AlreadyExists", f'namespaces "{new}" already exists')
            namespaces.add(new)
            return aiohttp.web.json_response(body, status=201)
        if raw.method == "DELETE" and name is not None:
            namespaces.discard(name)
            return aiohttp.web.json_response({"kind": "Status", "status": "Success"})
        return _status(405, "MethodNotAllowed", f"{raw.method} {raw.path}")

    def _stamp(self, obj: dict[str, Any]) -> None:
        self._version += 1
        meta = obj.setdefault("metadata", {})
        meta.setdefault("uid", str(uuid.uuid4()))
        meta.setdefault("creationTimestamp", _now())
        meta["resourceVersion"] = str(self._version)
        if obj.get("kind") == "Pod":
            obj.setdefault("status", {}).setdefault("phase", "Pending")
            self._api.pod_created.setdefault(str(meta.get("name", "")), time.time())

    def _access_review(self, body: Any) -> aiohttp.web.StreamResponse:
        attributes = (body or {}).get("spec", {}).get("resourceAttributes", {}) if isinstance(body, dict) else {}
        verb = str(attributes.get("verb", ""))
        resource = str(attributes.get("resource", ""))
        allowed = (verb, resource) not in self._api.denied
        answer = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SelfSubjectAccessReview",
            "metadata": {},
            "spec": (body or {}).get("spec", {}),
            "status": {"allowed": allowed, **({} if allowed else {"reason": f"no RBAC rule allows {verb} {resource}"})},
        }
        return aiohttp.web.json_response(answer, status=201)


def _status(code: int, reason: str, message: str) -> aiohttp.web.StreamResponse:
    body = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": code, "reason": reason}
    return aiohttp.web.json_response({**body, "message": message}, status=code)


def _now() -> str:
    return datetime.datetime.now(tz=datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubeApi:
    """``start()`` / ``stop()``; ``url``; ``kubeconfig()``; HTTP calls as the test."""

    def __init__(self, *, token: str = TOKEN) -> None:
        self.token = token
        self.denied: set[tuple[str, str]] = set()
        self.namespaces: set[str] = {"default", "kube-system"}
        # When each pod's create request arrived (Unix seconds), by name: the launch benchmark's clock.
        self.pod_created: dict[str, float] = {}
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="kubeapi", daemon=True)
        self._exit: Any = None

    def start(self) -> KubeApi:
        # One line per request would bury a failing test's own output.
        logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self._enter(), self._loop).result(15)
        self.ensure_namespace(NAMESPACE)
        return self

    async def _enter(self) -> None:
        cluster = _Cluster(self)
        for key, kind, namespaced in (
            ("v1/pods", "Pod", True),
            ("v1/nodes", "Node", False),
            ("v1/events", "Event", True),
        ):
            cluster.resources[key] = ResourceInfo(kind=kind, namespaced=namespaced, verbs={"get", "list", "watch"})
        handler = await cluster.__aenter__()
        server = Server(handler)
        await server.__aenter__()
        self._exit = (server, cluster)
        self.url = str(server.url).rstrip("/")

    def stop(self) -> None:
        async def leave() -> None:
            server, cluster = self._exit
            await server.__aexit__(None, None, None)
            await cluster.__aexit__(None, None, None)

        if self._exit is not None:
            asyncio.run_coroutine_threadsafe(leave(), self._loop).result(15)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(15)

    # ------------------------------------------------------------ set-up

    def deny(self, verb: str, resource: str) -> None:
        """From now on the access review answers ``allowed: false`` for it."""
        self.denied.add((verb, resource))

    def ensure_namespace(self, name: str) -> None:
        if self.get(f"/api/v1/namespaces/{name}") is None:
            self.post("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})

    def kubeconfig(self, *, namespace: str = NAMESPACE, token: str | None = None) -> str:
        """A kubeconfig (YAML) whose one context is this server with a token user."""
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {"server": self.url}}],
            "users": [{"name": "test", "user": {"token": self.token if token is None else token}}],
            "contexts": [{"name": "test", "context": {"cluster": "test", "user": "test", "namespace": namespace}}],
            "current-context": "test",
        }
        return str(yaml.safe_dump(config, sort_keys=False))

    # ------------------------------------------------------------ HTTP

    def get(self, path: str) -> Any:
        """The object or list at ``path``; None for 404."""
        return self._call("GET", path)

    def post(self, path: str, body: Any) -> Any:
        return self._call("POST", path, body)

    def patch(self, path: str, body: Any) -> Any:
        return self._call("PATCH", path, body, content_type="application/merge-patch+json")

    def delete(self, path: str) -> Any:
        return self._call("DELETE", path)

    def pods(self, namespace: str = NAMESPACE) -> list[dict[str, Any]]:
        found = self.get(f"/api/v1/namespaces/{namespace}/pods") or {}
        return list(found.get("items", []))

    def _call(self, method: str, path: str, body: Any = None, *, content_type: str = "application/json") -> Any:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(self.url + path, data=data, method=method)
        request.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            request.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                text = response.read()
        except urllib.error.HTTPError as error:
            if error.code == 404:
                return None
            raise AssertionError(f"{method} {path}: {error.code} {error.read()[:500]!r}") from error
        return json.loads(text) if text.strip() else None


@pytest.fixture
def kube_api() -> Iterator[KubeApi]:
    api = KubeApi().start()
    try:
        yield api
    finally:
        api.stop()
