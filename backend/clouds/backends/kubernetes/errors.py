"""The API server's answers as the typed errors of ``backends/errors.py``
(docs/BACKENDS.md, "Kubernetes", errors).

| Answer | Error | Scope | retry_after |
|---|---|---|---|
| 401 | ``AuthFailed`` (the token is wrong, expired or revoked) | account | — |
| 403 "exceeded quota" | ``QuotaExceeded`` (the namespace's ResourceQuota) | account | 120 s |
| 403 | ``AuthFailed`` naming the verb and resource, and the RBAC file to apply | account | — |
| 404 of the namespace | ``InvalidConfig`` naming it | account | — |
| 400, 422 | ``InvalidConfig`` with the API server's words (the image, selectors, tolerations) | account | — |
| 409 | ``Transient`` (callers handle AlreadyExists themselves) | offer | 1 s |
| 429 | ``Transient``, its Retry-After (≤ 60 s) | offer | 5 s |
| 5xx, timeouts, refused connections | ``Transient`` | offer | 5 s |
| TLS failure | ``InvalidConfig`` (the CA data) | account | — |

Messages carry the API server's own message (bounded), never a token.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from backend.clouds.backends.errors import AuthFailed, ComputeError, InvalidConfig, QuotaExceeded, Scope, Transient

RBAC_FILE = "deploy/kubernetes/backend-rbac.yaml"
DOCS = "docs/BACKENDS.md, Kubernetes"
QUOTA_SECONDS = 120.0
MAX_MESSAGE = 300
CLUSTER_WIDE = frozenset({"nodes", "namespaces", "selfsubjectaccessreviews", "version"})


def api_error(
    status: int,
    body: Any,
    *,
    verb: str,
    resource: str,
    namespace: str,
    server: str,
    retry_after: str | None = None,
) -> ComputeError:
    """The error for an answer ``status`` (with its Status ``body``) to
    ``verb`` on ``resource`` in ``namespace`` (cluster-wide resources name none)."""
    message = status_message(body)
    reason = str(body.get("reason", "")) if isinstance(body, Mapping) else ""
    said = f" ({status} {reason}: {message})" if message else f" ({status} {reason})".replace(" )", ")")
    where = "(cluster-wide)" if resource in CLUSTER_WIDE else f"in namespace {namespace}"
    if status == 401:
        return AuthFailed(
            f"the Kubernetes API server at {server} refused the kubeconfig's credentials{said}: the token is wrong, "
            f"expired or revoked; connect the backend again with a valid service account token ({DOCS})",
            code="Unauthorized",
        )
    if status == 403 and "exceeded quota" in message:
        return QuotaExceeded(
            f"the namespace {namespace}'s ResourceQuota does not allow another pod{said}",
            code="ExceededQuota",
            scope=Scope.ACCOUNT,
            retry_after=QUOTA_SECONDS,
        )
    if status == 403:
        return AuthFailed(
            f"the kubeconfig's user may not {verb} {resource} {where}{said}: apply {RBAC_FILE} ({DOCS})",
            code="Forbidden",
        )
    if status == 404 and _details_kind(body) == "namespaces":
        return InvalidConfig(
            f"the namespace {namespace} does not exist in the cluster at {server}: create it "
            f"(kubectl create namespace {namespace}) or set the backend's namespace",
            code="NamespaceNotFound",
        )
    if status in (400, 422):
        return InvalidConfig(
            f"the Kubernetes API server refused to {verb} {resource}{said}; check the backend's image, "
            "image_pull_secrets, node_selector and tolerations",
            code=reason or "Invalid",
        )
    if status == 409:
        return Transient(f"{verb} {resource} conflicted with another change{said}", code="Conflict", retry_after=1.0)
    if status == 429:
        return Transient(
            f"the Kubernetes API server at {server} is throttling requests{said}",
            code="TooManyRequests",
            retry_after=_seconds(retry_after, 5.0),
        )
    if status >= 500:
        return Transient(
            f"the Kubernetes API server at {server} failed to {verb} {resource}{said}", code=reason or "ServerError"
        )
    return Transient(f"{verb} {resource}: unexpected answer{said}", code=reason or f"HTTP{status}", retry_after=30.0)


def unreachable(server: str, error: BaseException, *, timeout: float) -> Transient:
    """A connection that failed or a server that did not answer within ``timeout``."""
    name = type(error).__name__
    if "Timeout" in name:
        return Transient(f"the Kubernetes API server at {server} did not answer within {timeout:g} s", code="Timeout")
    return Transient(f"cannot reach the Kubernetes API server at {server}: {_short(str(error))}", code="Unreachable")


def tls_failed(server: str, error: BaseException) -> InvalidConfig:
    return InvalidConfig(
        f"TLS with the Kubernetes API server at {server} failed ({_short(str(error))}): check the kubeconfig's "
        "certificate-authority-data (the cluster's CA) and client certificate",
        code="TlsFailed",
    )


def status_message(body: Any) -> str:
    """A Status answer's message, bounded."""
    if isinstance(body, Mapping):
        return _short(str(body.get("message", "")))
    return ""


def _details_kind(body: Any) -> str:
    details = body.get("details") if isinstance(body, Mapping) else None
    return str(details.get("kind", "")) if isinstance(details, Mapping) else ""


def _seconds(text: str | None, default: float) -> float:
    try:
        return min(max(float(text or default), 1.0), 60.0)
    except ValueError:
        return default


def _short(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= MAX_MESSAGE else text[: MAX_MESSAGE - 1] + "…"
