"""Checks that a connected cluster can do what Trainyard needs, for real.

``check_cluster`` runs them in order and raises at the first problem, with a
message that names what is wrong and what to do (``AuthFailed`` for
credentials and permissions, ``InvalidConfig`` for the kubeconfig, the
namespace, an API server it cannot reach), so nothing is saved for a
cluster that cannot work. The services call it outside any transaction.

1. The kubeconfig and config keys (``config.py``), and the API server's
   address (``client.py``: public, or in the operator's private networks).
2. ``GET /version``: the server answers, and the credentials hold.
3. One ``SelfSubjectAccessReview`` per permission the backend uses
   (``PERMISSIONS``); every one denied is named in one message, with the
   RBAC file to apply.
4. The namespace exists (when the user may read it).
5. The nodes: how many, and which GPU resources they advertise.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from backend.clouds.backends.base import AccountConfig
from backend.clouds.backends.errors import AuthFailed, InvalidConfig, Transient
from backend.clouds.backends.kubernetes.client import KubeClient
from backend.clouds.backends.kubernetes.config import KubeOptions
from backend.clouds.backends.kubernetes.errors import DOCS, RBAC_FILE
from backend.clouds.backends.kubernetes.offers import facts_of

SSAR_PATH = "/apis/authorization.k8s.io/v1/selfsubjectaccessreviews"
# (verb, resource, subresource, namespaced): what the backend does, and the RBAC file grants.
PERMISSIONS: tuple[tuple[str, str, str, bool], ...] = (
    ("create", "pods", "", True),
    ("get", "pods", "", True),
    ("list", "pods", "", True),
    ("watch", "pods", "", True),
    ("delete", "pods", "", True),
    ("get", "pods", "log", True),
    ("get", "events", "", True),
    ("list", "events", "", True),
    ("watch", "events", "", True),
    ("get", "nodes", "", False),
    ("list", "nodes", "", False),
    ("watch", "nodes", "", False),
)


@dataclass(frozen=True)
class ClusterCheck:
    server_version: str
    namespace: str
    nodes: int
    gpu_resources: tuple[str, ...]


def check_cluster(account: AccountConfig) -> ClusterCheck:
    """Every check of the module docstring, in order (``AuthFailed`` /
    ``InvalidConfig`` at the first problem)."""
    options = KubeOptions.of(account)
    client = KubeClient(options.endpoint, allowed_networks=options.allowed_networks, namespace=options.namespace)
    try:
        version = client.get("/version", resource="version") or {}
        denied = [p for p in PERMISSIONS if not _allowed(client, options.namespace, *p)]
        if denied:
            raise AuthFailed(
                f"the kubeconfig's user may not {_named(denied, options.namespace)}: apply {RBAC_FILE} ({DOCS})",
                code="Forbidden",
            )
        if not _namespace_exists(client, options.namespace):
            raise InvalidConfig(
                f"the namespace {options.namespace} does not exist in the cluster: create it "
                f"(kubectl create namespace {options.namespace}) or set the backend's namespace",
                code="NamespaceNotFound",
            )
        nodes = client.list("/api/v1/nodes", resource="nodes")
    except Transient as error:
        raise InvalidConfig(
            f"{error.message}; check the kubeconfig's server and the cluster", code=error.code
        ) from None
    facts = facts_of(nodes, gpu_resource=options.gpu_resource)
    return ClusterCheck(
        server_version=str(version.get("gitVersion", "")),
        namespace=options.namespace,
        nodes=len(nodes),
        gpu_resources=tuple(facts["gpu_resources"]),
    )


def _namespace_exists(client: KubeClient, namespace: str) -> bool:
    """False only when the API server says there is no such namespace (the
    RBAC file does not grant reading namespaces: a refusal tells nothing)."""
    try:
        found = client.get(f"/api/v1/namespaces/{namespace}", resource="namespaces")
    except AuthFailed as error:
        if error.code == "Forbidden":
            return True
        raise
    return found is not None


def _allowed(client: KubeClient, namespace: str, verb: str, resource: str, subresource: str, namespaced: bool) -> bool:
    attributes: dict[str, Any] = {"verb": verb, "resource": resource}
    if subresource:
        attributes["subresource"] = subresource
    if namespaced:
        attributes["namespace"] = namespace
    body = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SelfSubjectAccessReview",
        "spec": {"resourceAttributes": attributes},
    }
    answer = client.request("POST", SSAR_PATH, body=body, verb="create", resource="selfsubjectaccessreviews") or {}
    return bool((answer.get("status") or {}).get("allowed"))


def _named(denied: list[tuple[str, str, str, bool]], namespace: str) -> str:
    """ "create pods, get pods/log in namespace ml; list nodes (cluster-wide)"."""
    inside = [
        f"{verb} {resource}{'/' + sub if sub else ''}" for verb, resource, sub, namespaced in denied if namespaced
    ]
    outside = [f"{verb} {resource}" for verb, resource, _sub, namespaced in denied if not namespaced]
    parts = []
    if inside:
        parts.append(f"{', '.join(inside)} in namespace {namespace}")
    if outside:
        parts.append(f"{', '.join(outside)} (cluster-wide)")
    return "; ".join(parts)
