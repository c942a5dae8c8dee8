"""A small synchronous client of the Kubernetes API: JSON over urllib3.

Not the ``kubernetes`` or ``lightkube`` libraries: their kubeconfig loaders
run ``exec`` plugins and read files the kubeconfig names, which a tenant's
kubeconfig must never make the server do
(docs/decisions/0147-kubernetes-client.md). What this one does:

- every request has a connect (5 s) and a read (30 s) timeout, its whole
  answer must arrive within 60 s and be at most 64 MiB (the API server is
  the tenant's: it must not hold a worker nor fill its memory), redirects
  are refused, and it is made once: the callers' own retries (Celery's)
  decide what happens next;
- TLS verifies against the kubeconfig's CA data (or the system's CAs); a
  client certificate and key are written to private temporary files only
  for as long as ``ssl`` takes to load them;
- the API server's host is resolved here and the connection made to the
  address checked: it must be a public address or lie in
  ``allowed_networks`` (the operator's ``TRAINYARD_KUBERNETES_PRIVATE_NETWORKS``),
  so a tenant cannot point the server at its own private network. TLS still
  checks the certificate against the host's name;
- answers ≥ 400 become ``errors.py`` errors (``kubernetes/errors.py``); a 404
  is ``None`` where the caller says it may be missing.
"""

from __future__ import annotations

import concurrent.futures
import ipaddress
import json
import os
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import urllib3
from urllib3.exceptions import HTTPError, SSLError

from backend.clouds.backends.errors import InvalidConfig, Transient
from backend.clouds.backends.kubernetes.config import Endpoint
from backend.clouds.backends.kubernetes.errors import api_error, tls_failed, unreachable

CONNECT_TIMEOUT = 5.0
READ_TIMEOUT = 30.0  # between two reads
TOTAL_TIMEOUT = 60.0  # one whole answer
MAX_ANSWER_BYTES = 64 * 2**20  # a list of thousands of pods or events is a few MiB
CHUNK = 2**16
RESOLVE_SECONDS = 60.0  # how long a checked address of the API server is reused
MAX_POOL = 4

Network = ipaddress.IPv4Network | ipaddress.IPv6Network
# Name look-ups of API servers, each bounded by the connect timeout.
_RESOLVER = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="kube-resolve")


class KubeClient:
    """Requests to one API server as one user. Thread-safe: the pool is urllib3's."""

    def __init__(
        self,
        endpoint: Endpoint,
        *,
        allowed_networks: tuple[Network, ...] = (),
        namespace: str = "",
        connect_timeout: float = CONNECT_TIMEOUT,
        read_timeout: float = READ_TIMEOUT,
        total_timeout: float = TOTAL_TIMEOUT,
        max_answer_bytes: int = MAX_ANSWER_BYTES,
    ) -> None:
        self.endpoint = endpoint
        self.allowed_networks = allowed_networks
        self.namespace = namespace
        self.timeout = urllib3.Timeout(connect=connect_timeout, read=read_timeout)
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.total_timeout = total_timeout
        self.max_answer_bytes = max_answer_bytes
        self._lock = threading.Lock()
        self._pool: urllib3.HTTPConnectionPool | None = None
        self._pool_until = 0.0

    # ------------------------------------------------------------------ verbs

    def get(self, path: str, *, params: Mapping[str, str] | None = None, verb: str = "get", resource: str) -> Any:
        """The object or list at ``path``; None when it does not exist (404)."""
        return self.request("GET", path, params=params, verb=verb, resource=resource, missing_ok=True)

    def create(self, path: str, body: Mapping[str, Any], *, resource: str) -> tuple[int, Any]:
        """(status, answer): 409 AlreadyExists is answered, not raised."""
        return self.call("POST", path, body=body, verb="create", resource=resource, conflict_ok=True)

    def delete(self, path: str, *, resource: str, body: Mapping[str, Any] | None = None) -> Any:
        """The answer (the object, now marked for deletion or gone); None when
        it did not exist; a 409 (a precondition that no longer holds) is None too."""
        status, answer = self.call(
            "DELETE", path, body=body, verb="delete", resource=resource, missing_ok=True, conflict_ok=True
        )
        return None if status in (404, 409) else answer

    def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
        verb: str,
        resource: str,
        missing_ok: bool = False,
    ) -> Any:
        status, answer = self.call(
            method, path, params=params, body=body, verb=verb, resource=resource, missing_ok=missing_ok
        )
        return None if status == 404 else answer

    def list(self, path: str, *, params: Mapping[str, str] | None = None, resource: str, page: int = 500) -> list[Any]:
        """Every item of a list, page by page (``limit`` / ``continue``)."""
        items: list[Any] = []
        token = ""
        while True:
            query = {**(params or {}), "limit": str(page), **({"continue": token} if token else {})}
            answer = self.request("GET", path, params=query, verb="list", resource=resource) or {}
            items.extend(answer.get("items") or [])
            token = str((answer.get("metadata") or {}).get("continue") or "")
            if not token:
                return items

    def call(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: Mapping[str, Any] | None = None,
        verb: str,
        resource: str,
        missing_ok: bool = False,
        conflict_ok: bool = False,
    ) -> tuple[int, Any]:
        """One request; (status, decoded JSON answer). A status ≥ 400 raises,
        except 404 with ``missing_ok`` and 409 with ``conflict_ok``."""
        url = path + ("?" + urlencode(params) if params else "")
        headers = {"Accept": "application/json", "Host": self._host_header()}
        if self.endpoint.token:
            headers["Authorization"] = f"Bearer {self.endpoint.token}"
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        pool = self._connection()
        deadline = time.monotonic() + self.total_timeout
        try:
            response = pool.urlopen(
                method,
                url,
                body=data,
                headers=headers,
                timeout=self.timeout,
                retries=False,
                redirect=False,
                preload_content=False,
            )
            try:
                raw = self._read(response, deadline)
            finally:
                response.release_conn()
        except SSLError as error:
            raise tls_failed(self.endpoint.server, error) from None
        except (HTTPError, OSError) as error:
            raise unreachable(self.endpoint.server, error, timeout=self.read_timeout) from None
        try:
            answer = json.loads(raw) if raw.strip() else None
        except ValueError:
            answer = {"message": raw[:300].decode(errors="replace")}
        status = int(response.status)
        if 300 <= status < 400:
            raise InvalidConfig(
                f"the Kubernetes API server at {self.endpoint.server} answered a redirect ({status}) to "
                f"{str(response.headers.get('Location', ''))[:200]!r}; redirects are not followed: point the "
                "kubeconfig's server at the API server itself",
                code="Redirect",
            )
        if (
            status < 400
            or (status == 404 and missing_ok and not _namespace_missing(answer))
            or (status == 409 and conflict_ok)
        ):
            return status, answer
        raise api_error(
            status,
            answer,
            verb=verb,
            resource=resource,
            namespace=self.namespace,
            server=self.endpoint.server,
            retry_after=response.headers.get("Retry-After"),
        )

    def _read(self, response: urllib3.BaseHTTPResponse, deadline: float) -> bytes:
        """The answer's body: at most ``max_answer_bytes``, read before
        ``deadline`` (a server that trickles bytes is as silent as one that
        sends none)."""
        chunks: list[bytes] = []
        size = 0
        while chunk := response.read1(CHUNK):
            size += len(chunk)
            if size > self.max_answer_bytes:
                raise Transient(
                    f"the Kubernetes API server at {self.endpoint.server} answered more than "
                    f"{self.max_answer_bytes // 2**20} MiB to one request",
                    code="AnswerTooLarge",
                    retry_after=60.0,
                )
            if time.monotonic() > deadline:
                raise Transient(
                    f"the Kubernetes API server at {self.endpoint.server} did not finish its answer within "
                    f"{self.total_timeout:g} s",
                    code="Timeout",
                )
            chunks.append(chunk)
        return b"".join(chunks)

    # ------------------------------------------------------------------ connection

    def _host_header(self) -> str:
        host = self.endpoint.host
        shown = f"[{host}]" if ":" in host else host
        default = 443 if self.endpoint.server.startswith("https") else 80
        return shown if self.endpoint.port == default else f"{shown}:{self.endpoint.port}"

    def _connection(self) -> urllib3.HTTPConnectionPool:
        with self._lock:
            if self._pool is None or time.monotonic() > self._pool_until:
                address = self._address()
                if self._pool is not None:
                    self._pool.close()
                self._pool = self._new_pool(address)
                self._pool_until = time.monotonic() + RESOLVE_SECONDS
            return self._pool

    def _address(self) -> str:
        """The API server's address to connect to, checked (module docstring)."""
        host, port = self.endpoint.host, self.endpoint.port
        # The system's resolver has no timeout of its own: it is waited for in a thread, as long as a connect.
        lookup = _RESOLVER.submit(socket.getaddrinfo, host, port, type=socket.SOCK_STREAM)
        try:
            found = lookup.result(timeout=self.connect_timeout)
        except concurrent.futures.TimeoutError:
            raise Transient(
                f"the Kubernetes API server's name {host} did not resolve within {self.connect_timeout:g} s",
                code="Timeout",
            ) from None
        except OSError as error:
            raise unreachable(self.endpoint.server, error, timeout=self.read_timeout) from None
        addresses = [str(info[4][0]) for info in found]
        if self.endpoint.in_cluster:
            return addresses[0]
        for text in addresses:
            address = ipaddress.ip_address(text.split("%")[0])
            if not (address.is_global or any(address in net for net in self.allowed_networks)):
                raise InvalidConfig(
                    f"the kubeconfig's API server {host} is at {address}, a private address this server may not "
                    "connect to for a backend; the operator allows private networks with "
                    "TRAINYARD_KUBERNETES_PRIVATE_NETWORKS (docs/BACKENDS.md, Kubernetes)",
                    code="PrivateApiServer",
                )
        return addresses[0]

    def _new_pool(self, address: str) -> urllib3.HTTPConnectionPool:
        port = self.endpoint.port
        if not self.endpoint.server.startswith("https"):
            return urllib3.HTTPConnectionPool(address, port, maxsize=MAX_POOL, block=False)
        context = self._ssl_context()
        return urllib3.HTTPSConnectionPool(
            address,
            port,
            maxsize=MAX_POOL,
            block=False,
            ssl_context=context,
            server_hostname=self.endpoint.host,
            assert_hostname=False if self.endpoint.insecure else self.endpoint.host,
            cert_reqs=ssl.CERT_NONE if self.endpoint.insecure else ssl.CERT_REQUIRED,
        )

    def _ssl_context(self) -> ssl.SSLContext:
        endpoint = self.endpoint
        try:
            context = ssl.create_default_context(cadata=endpoint.ca_pem or None)
        except ssl.SSLError as error:
            raise tls_failed(endpoint.server, error) from None
        if endpoint.insecure:
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if endpoint.cert_pem and endpoint.key_pem:
            _load_client_certificate(context, endpoint)
        return context


def _load_client_certificate(context: ssl.SSLContext, endpoint: Endpoint) -> None:
    """``ssl`` reads a certificate and key only from files: private ones, removed at once."""
    with tempfile.TemporaryDirectory(prefix="ty-kube-") as folder:
        os.chmod(folder, 0o700)
        cert, key = Path(folder) / "client.crt", Path(folder) / "client.key"
        for path, text in ((cert, endpoint.cert_pem), (key, endpoint.key_pem)):
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(descriptor, "w") as file:
                file.write(text)
        try:
            context.load_cert_chain(cert, key)
        except ssl.SSLError as error:
            raise tls_failed(endpoint.server, error) from None


def _namespace_missing(answer: Any) -> bool:
    details = answer.get("details") if isinstance(answer, Mapping) else None
    return isinstance(details, Mapping) and details.get("kind") == "namespaces"


def path_of(namespace: str, resource: str, name: str = "") -> str:
    """``/api/v1/namespaces/<ns>/<resource>[/<name>]`` (core group)."""
    tail = f"/{quote(name, safe='')}" if name else ""
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/{resource}{tail}"
