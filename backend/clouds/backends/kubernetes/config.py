"""The kubernetes backend's credentials and config keys, read and checked once
(docs/BACKENDS.md, "Kubernetes").

Credentials: ``{"kubeconfig": "<YAML>"}``, or none with ``in_cluster: true``
(the server's own service account, only where the operator allowed it: the
services pass ``in_cluster_allowed``).

A kubeconfig is a tenant's text, so only what it carries inline is used: a
bearer ``token``, ``client-certificate-data`` / ``client-key-data``,
``certificate-authority-data``. Anything that would make the server run a
program (``exec``, ``auth-provider``) or read one of its own files
(``certificate-authority``, ``client-certificate``, ``client-key``,
``tokenFile``) is refused, naming the key and what to use instead.

Config keys: ``namespace`` (required), ``context``, ``cluster``, ``image``,
``image_pull_secrets``, ``node_selector``, ``tolerations``, ``prices``,
``spot_prices``, ``default_price``, ``node_pools``,
``schedule_timeout_seconds``, ``termination_grace_seconds``,
``gpu_resource``; set by the server: ``facts``, ``allowed_networks``,
``in_cluster_allowed``.
"""

from __future__ import annotations

import base64
import binascii
import ipaddress
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from backend.clouds.backends.base import AccountConfig
from backend.clouds.backends.errors import InvalidConfig

DEFAULT_IMAGE = "python:3.12-slim"
DEFAULT_GPU_RESOURCE = "nvidia.com/gpu"
DEFAULT_SCHEDULE_TIMEOUT = 300.0
DEFAULT_TERMINATION_GRACE = 120
MAX_KUBECONFIG_BYTES = 64 * 1024
# Where a pod's service account token is mounted (in-cluster mode).
SERVICE_ACCOUNT_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
DOCS = "docs/BACKENDS.md, Kubernetes"

# DNS-1123 label (namespaces, secret names) and the qualified names of labels and resources.
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")
_QUALIFIED = re.compile(r"^([a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$")
_LABEL_VALUE = re.compile(r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")
_EFFECTS = ("NoSchedule", "PreferNoSchedule", "NoExecute")
_FILE_KEYS = {
    "certificate-authority": "certificate-authority-data (the CA's PEM, base64)",
    "client-certificate": "client-certificate-data, or better a service account token",
    "client-key": "client-key-data, or better a service account token",
    "tokenFile": "token (a service account token)",
}


@dataclass(frozen=True)
class Endpoint:
    """How to reach the API server: its URL, TLS material (PEM text) and the token."""

    server: str
    ca_pem: str = ""
    insecure: bool = False
    token: str = field(default="", repr=False)
    cert_pem: str = field(default="", repr=False)
    key_pem: str = field(default="", repr=False)
    cluster: str = ""  # the kubeconfig's name for the cluster
    namespace: str = ""  # the context's namespace, if it names one
    in_cluster: bool = False

    @property
    def host(self) -> str:
        return urlsplit(self.server).hostname or ""

    @property
    def port(self) -> int:
        parts = urlsplit(self.server)
        return parts.port or (443 if parts.scheme == "https" else 80)


@dataclass(frozen=True)
class NodePool:
    """A pool an autoscaler grows from zero: offered although no node of it exists yet."""

    name: str
    instance_type: str
    cpus: int
    memory_gib: float
    gpus: int = 0
    gpu_name: str = ""
    gpu_memory_gib: float = 0.0
    spot: bool = False
    price: float | None = None
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()


@dataclass(frozen=True)
class KubeOptions:
    endpoint: Endpoint
    namespace: str
    cluster: str
    image: str = DEFAULT_IMAGE
    image_pull_secrets: tuple[str, ...] = ()
    node_selector: Mapping[str, str] = field(default_factory=dict)
    tolerations: tuple[Mapping[str, Any], ...] = ()
    prices: Mapping[str, float] = field(default_factory=dict)
    spot_prices: Mapping[str, float] = field(default_factory=dict)
    default_price: float = 0.0
    node_pools: tuple[NodePool, ...] = ()
    schedule_timeout: float = DEFAULT_SCHEDULE_TIMEOUT
    termination_grace: int = DEFAULT_TERMINATION_GRACE
    gpu_resource: str = DEFAULT_GPU_RESOURCE
    allowed_networks: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()

    @classmethod
    def of(cls, account: AccountConfig) -> KubeOptions:
        config = account.config
        endpoint = endpoint_of(account)
        namespace = _string(config, "namespace", required=True)
        if not _DNS_LABEL.match(namespace):
            raise _invalid("namespace", "a namespace name (lower-case letters, digits and '-')", namespace)
        spot_prices = _prices(config, "spot_prices")
        prices = _prices(config, "prices")
        return cls(
            endpoint=endpoint,
            namespace=namespace,
            cluster=_string(config, "cluster") or endpoint.cluster or "cluster",
            image=_string(config, "image") or DEFAULT_IMAGE,
            image_pull_secrets=tuple(_dns_names(config, "image_pull_secrets")),
            node_selector=_labels(config.get("node_selector"), "node_selector"),
            tolerations=_tolerations(config.get("tolerations"), "tolerations"),
            prices=prices,
            spot_prices=spot_prices if "spot_prices" in config else prices,
            default_price=_number(config, "default_price", 0.0),
            node_pools=_node_pools(config.get("node_pools")),
            schedule_timeout=_number(config, "schedule_timeout_seconds", DEFAULT_SCHEDULE_TIMEOUT),
            termination_grace=int(_number(config, "termination_grace_seconds", DEFAULT_TERMINATION_GRACE)),
            gpu_resource=_resource_name(config.get("gpu_resource", DEFAULT_GPU_RESOURCE)),
            allowed_networks=_networks(config.get("allowed_networks")),
        )


def endpoint_of(account: AccountConfig) -> Endpoint:
    """The API server the account names: its kubeconfig, or the server's own
    service account when ``in_cluster`` is set and allowed."""
    config = account.config
    if config.get("in_cluster") is True:
        if config.get("in_cluster_allowed") is not True:
            raise InvalidConfig(
                "this server does not allow in-cluster Kubernetes backends (the operator sets "
                "TRAINYARD_KUBERNETES_IN_CLUSTER=true to allow them); connect with a kubeconfig instead",
                code="InClusterNotAllowed",
            )
        return in_cluster_endpoint()
    text = account.credentials.get("kubeconfig", "")
    if not text:
        raise InvalidConfig(
            "the kubernetes backend needs a kubeconfig (credentials 'kubeconfig'), or in_cluster: true",
            code="MissingConfig",
        )
    context = config.get("context")
    if context is not None and not isinstance(context, str):
        raise _invalid("context", "the name of a context of the kubeconfig", context)
    return parse_kubeconfig(text, context=context or "")


def parse_kubeconfig(text: str, *, context: str = "") -> Endpoint:
    """The endpoint of ``context`` (default: the current context) in a
    kubeconfig, from what it carries inline only (module docstring)."""
    if len(text.encode()) > MAX_KUBECONFIG_BYTES:
        raise InvalidConfig(f"the kubeconfig is larger than {MAX_KUBECONFIG_BYTES // 1024} KiB", code="BadKubeconfig")
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as error:
        where = getattr(error, "problem_mark", None)
        line = f" (line {where.line + 1})" if where is not None else ""
        raise InvalidConfig(f"the kubeconfig is not valid YAML{line}", code="BadKubeconfig") from None
    if not isinstance(doc, dict):
        raise InvalidConfig("the kubeconfig is not a YAML mapping (apiVersion: v1, kind: Config)", code="BadKubeconfig")
    name = context or doc.get("current-context") or ""
    if not isinstance(name, str) or not name:
        raise InvalidConfig(
            "the kubeconfig has no current-context; set the backend's 'context' to one of its contexts",
            code="BadKubeconfig",
        )
    ctx = _named(doc, "contexts", "context", name)
    cluster_name = ctx.get("cluster")
    user_name = ctx.get("user")
    if not isinstance(cluster_name, str) or not cluster_name:
        raise InvalidConfig(f"the kubeconfig's context {name!r} names no cluster", code="BadKubeconfig")
    cluster = _named(doc, "clusters", "cluster", cluster_name)
    user = _named(doc, "users", "user", user_name) if isinstance(user_name, str) and user_name else {}
    for what, section in (("cluster", cluster), ("user", user)):
        for key, instead in _FILE_KEYS.items():
            if section.get(key):
                raise InvalidConfig(
                    f"the kubeconfig's {what} uses {key!r}, a file on the machine that reads it; the server reads "
                    f"no file for a backend: use {instead} ({DOCS})",
                    code="KubeconfigFileReference",
                )
    for key in ("exec", "auth-provider"):
        if user.get(key):
            raise InvalidConfig(
                f"the kubeconfig's user uses {key!r}, which runs a program to get credentials; the server runs no "
                f"program for a backend: use a service account token ('token'; {DOCS})",
                code="KubeconfigExec",
            )
    if user.get("username") or user.get("password"):
        raise InvalidConfig(
            f"the kubeconfig's user uses basic authentication, which Kubernetes removed; use a service account "
            f"token ('token'; {DOCS})",
            code="KubeconfigBasicAuth",
        )
    server = cluster.get("server")
    if not isinstance(server, str) or not server:
        raise InvalidConfig(f"the kubeconfig's cluster {cluster_name!r} has no server URL", code="BadKubeconfig")
    parts = urlsplit(server)
    if parts.scheme not in ("https", "http") or not parts.hostname:
        raise InvalidConfig(
            f"the kubeconfig's server {server!r} is not an https:// URL of the API server", code="BadKubeconfig"
        )
    token = user.get("token", "")
    cert = _pem(user, "client-certificate-data")
    key = _pem(user, "client-key-data")
    if not isinstance(token, str) or (not token and not (cert and key)):
        raise InvalidConfig(
            f"the kubeconfig's user has no credentials the server can use: give it a service account 'token' "
            f"({DOCS}), or client-certificate-data and client-key-data",
            code="KubeconfigNoCredentials",
        )
    namespace = ctx.get("namespace", "")
    return Endpoint(
        server=server.rstrip("/"),
        ca_pem=_pem(cluster, "certificate-authority-data"),
        insecure=cluster.get("insecure-skip-tls-verify") is True,
        token=token,
        cert_pem=cert,
        key_pem=key,
        cluster=cluster_name,
        namespace=namespace if isinstance(namespace, str) else "",
    )


def in_cluster_endpoint() -> Endpoint:
    """The server's own service account, as a pod sees it (its environment
    and the mounted token): the operator's choice, not a tenant's."""
    host = os.environ.get("KUBERNETES_SERVICE_HOST", "")
    port = os.environ.get("KUBERNETES_SERVICE_PORT", "443")
    try:
        token = (SERVICE_ACCOUNT_DIR / "token").read_text().strip()
        ca = (SERVICE_ACCOUNT_DIR / "ca.crt").read_text()
    except OSError:
        token, ca = "", ""
    if not host or not token:
        raise InvalidConfig(
            "in_cluster: the server does not run in a Kubernetes pod with a service account token "
            f"(KUBERNETES_SERVICE_HOST, {SERVICE_ACCOUNT_DIR}/token)",
            code="NotInCluster",
        )
    bracketed = f"[{host}]" if ":" in host else host
    return Endpoint(server=f"https://{bracketed}:{port}", ca_pem=ca, token=token, cluster="in-cluster", in_cluster=True)


def label_safe(value: str) -> bool:
    return bool(_LABEL_VALUE.match(value))


def _named(doc: Mapping[str, Any], section: str, inner: str, name: str) -> Mapping[str, Any]:
    entries = doc.get(section) or []
    if isinstance(entries, list):
        for entry in entries:
            if isinstance(entry, dict) and entry.get("name") == name and isinstance(entry.get(inner), dict):
                return dict(entry[inner])
    raise InvalidConfig(f"the kubeconfig has no {inner} named {name!r}", code="BadKubeconfig")


def _pem(section: Mapping[str, Any], key: str) -> str:
    value = section.get(key)
    if not value:
        return ""
    try:
        text = base64.b64decode(str(value), validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        raise InvalidConfig(f"the kubeconfig's {key} is not base64 of a PEM text", code="BadKubeconfig") from None
    if "-----BEGIN" not in text:
        raise InvalidConfig(f"the kubeconfig's {key} is not base64 of a PEM text", code="BadKubeconfig")
    return text


def _string(config: Mapping[str, object], key: str, *, required: bool = False) -> str:
    value = config.get(key)
    if value is None and not required:
        return ""
    if not isinstance(value, str) or not value:
        if value is None:
            raise InvalidConfig(f"the kubernetes backend needs config key {key!r}", code="MissingConfig")
        raise _invalid(key, "a non-empty string", value)
    return value


def _number(config: Mapping[str, object], key: str, default: float) -> float:
    value = config.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise _invalid(key, "a number ≥ 0", value)
    return float(value)


def _prices(config: Mapping[str, object], key: str) -> dict[str, float]:
    value = config.get(key) or {}
    if not isinstance(value, Mapping):
        raise _invalid(key, "an object of instance type → USD per hour", value)
    out: dict[str, float] = {}
    for name, price in value.items():
        if not isinstance(name, str) or isinstance(price, bool) or not isinstance(price, int | float) or price < 0:
            raise _invalid(f"{key}.{name}", "a price ≥ 0 in USD per hour", price)
        out[name] = float(price)
    return out


def _dns_names(config: Mapping[str, object], key: str) -> list[str]:
    value = config.get(key) or []
    if not isinstance(value, list | tuple) or not all(isinstance(v, str) and _DNS_LABEL.match(v) for v in value):
        raise _invalid(key, "a list of secret names", value)
    return list(value)


def _labels(value: object, key: str) -> dict[str, str]:
    """Node labels to select on: qualified names → label values."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _invalid(key, "an object of label → value", value)
    out: dict[str, str] = {}
    for name, text in value.items():
        if not isinstance(name, str) or not _QUALIFIED.match(name):
            raise _invalid(key, "an object whose keys are label names (example.com/pool)", name)
        if not isinstance(text, str) or not _LABEL_VALUE.match(text):
            raise _invalid(f"{key}.{name}", "a label value (≤ 63 letters, digits, '-', '_', '.')", text)
        out[name] = text
    return out


def _tolerations(value: object, key: str) -> tuple[dict[str, Any], ...]:
    """Pod tolerations ({key, operator, value, effect, tolerationSeconds}), checked field by field."""
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or not all(isinstance(item, Mapping) for item in value):
        raise _invalid(key, "a list of tolerations ({key, operator, value, effect})", value)
    out = []
    for item in value:
        unknown = set(item) - {"key", "operator", "value", "effect", "tolerationSeconds"}
        if unknown:
            raise _invalid(key, "tolerations with only key, operator, value, effect, tolerationSeconds", item)
        toleration: dict[str, Any] = {}
        name = item.get("key", "")
        if not isinstance(name, str) or (name and not _QUALIFIED.match(name)):
            raise _invalid(f"{key}[].key", "a taint key (example.com/dedicated)", name)
        operator = item.get("operator", "Equal")
        if operator not in ("Equal", "Exists"):
            raise _invalid(f"{key}[].operator", "Equal or Exists", operator)
        text = item.get("value", "")
        if not isinstance(text, str) or not _LABEL_VALUE.match(text) or (operator == "Exists" and text):
            raise _invalid(f"{key}[].value", "a label value (none with operator Exists)", text)
        effect = item.get("effect", "")
        if effect and effect not in _EFFECTS:
            raise _invalid(f"{key}[].effect", "NoSchedule, PreferNoSchedule or NoExecute", effect)
        seconds = item.get("tolerationSeconds")
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int)):
            raise _invalid(f"{key}[].tolerationSeconds", "an integer", seconds)
        if not name and operator != "Exists":
            raise _invalid(f"{key}[].key", "a taint key (only operator Exists may leave it out)", name)
        for field_name, field_value in (
            ("key", name),
            ("operator", operator),
            ("value", text),
            ("effect", effect),
            ("tolerationSeconds", seconds),
        ):
            if field_value not in ("", None):
                toleration[field_name] = field_value
        out.append(toleration)
    return tuple(out)


def _node_pools(value: object) -> tuple[NodePool, ...]:
    if value is None:
        return ()
    if not isinstance(value, list | tuple) or not all(isinstance(item, Mapping) for item in value):
        raise _invalid("node_pools", "a list of pools ({name, instance_type, cpus, memory_gib, …})", value)
    pools = []
    for item in value:

        def get(name: str, kind: type | tuple[type, ...], default: object = None, _item: Any = item) -> Any:
            got = _item.get(name, default)
            if got is None or isinstance(got, bool) != (kind is bool) or not isinstance(got, kind):
                raise _invalid(f"node_pools[].{name}", _KIND_WORDS.get(kind, "a value"), got)
            return got

        name = get("name", str)
        cpus = get("cpus", int)
        memory = get("memory_gib", (int, float))
        gpus = get("gpus", int, 0)
        price = item.get("price")
        if price is not None and (isinstance(price, bool) or not isinstance(price, int | float) or price < 0):
            raise _invalid("node_pools[].price", "a price ≥ 0 in USD per hour", price)
        if cpus < 1 or memory <= 0 or gpus < 0:
            raise _invalid("node_pools[]", "a pool with cpus ≥ 1, memory_gib > 0 and gpus ≥ 0", dict(item))
        pools.append(
            NodePool(
                name=name,
                instance_type=get("instance_type", str, name),
                cpus=cpus,
                memory_gib=float(memory),
                gpus=gpus,
                gpu_name=get("gpu_name", str, ""),
                gpu_memory_gib=float(get("gpu_memory_gib", (int, float), 0)),
                spot=get("spot", bool, False),
                price=None if price is None else float(price),
                node_selector=_labels(item.get("node_selector"), "node_pools[].node_selector"),
                tolerations=_tolerations(item.get("tolerations"), "node_pools[].tolerations"),
            )
        )
    return tuple(pools)


_KIND_WORDS: dict[object, str] = {
    str: "a non-empty string",
    int: "an integer",
    (int, float): "a number",
    bool: "true or false",
}


def _resource_name(value: object) -> str:
    if not isinstance(value, str) or not _QUALIFIED.match(value) or "/" not in value:
        raise _invalid("gpu_resource", "an extended resource name such as nvidia.com/gpu", value)
    return value


def _networks(value: object) -> tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...]:
    if value is None:
        return ()
    if not isinstance(value, Sequence) or isinstance(value, str):
        raise _invalid("allowed_networks", "a list of CIDR networks", value)
    try:
        return tuple(ipaddress.ip_network(str(item), strict=False) for item in value)
    except ValueError:
        raise _invalid("allowed_networks", "a list of CIDR networks", value) from None


def _invalid(key: str, expected: str, value: object) -> InvalidConfig:
    shown = repr(value)
    shown = shown if len(shown) <= 200 else shown[:200] + "…"
    return InvalidConfig(
        f"the kubernetes backend's config key {key!r} must be {expected}, not {shown}", code="BadConfig"
    )
