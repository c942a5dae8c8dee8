"""Where apps are served: TRAINYARD_APPS_URL, ``scheme://{app}.<domain>[:port]``.

Every app (a job attempt's port) has an origin of its own: ``{app}`` is a
label derived from the attempt and the port with the server's secret
(``app_label``), so it cannot be guessed from the run, and two apps, or an
app and the dashboard, never share an origin or a cookie scope
(docs/decisions/0102-apps-origin.md). A request whose host is on the apps
domain is the apps proxy's, whatever the label; any other is the dashboard's.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from dataclasses import dataclass
from urllib.parse import urlsplit

from backend.core.env import ConfigError

LABEL_LENGTH = 26  # 130 bits of base32: a DNS label of [a-z2-7]
_LABEL = re.compile(rf"^[a-z2-7]{{{LABEL_LENGTH}}}$")
PLACEHOLDER = "{app}"


@dataclass(frozen=True)
class AppsOrigin:
    """TRAINYARD_APPS_URL parsed: ``domain`` is what follows ``{app}.`` in
    the host, ``port`` is ``:<n>`` or empty."""

    scheme: str
    domain: str
    port: str

    @property
    def secure(self) -> bool:
        return self.scheme == "https"

    def origin(self, label: str) -> str:
        return f"{self.scheme}://{label}.{self.domain}{self.port}"

    def covers(self, host: str) -> bool:
        """``host`` (a Host header, port or not) is on the apps domain."""
        name = _hostname(host)
        return name == self.domain or name.endswith("." + self.domain)

    def label_of(self, host: str) -> str | None:
        """The app label a Host header names, or None."""
        name = _hostname(host)
        label, dot, rest = name.partition(".")
        return label if dot and rest == self.domain and _LABEL.match(label) else None


def apps_origin_parse(url: str, *, name: str = "TRAINYARD_APPS_URL") -> AppsOrigin | None:
    """None for an empty value (apps off); a ConfigError naming what is wrong otherwise."""
    if not url:
        return None
    parts = urlsplit(url)
    example = "e.g. https://{app}.apps.example.com"
    if parts.scheme not in {"http", "https"} or parts.path not in {"", "/"} or parts.query or parts.fragment:
        raise ConfigError(f"{name}={url!r}: give only a scheme and a host with {PLACEHOLDER} ({example}).")
    netloc = parts.netloc.lower()
    host, colon, port = netloc.partition(":")
    if not host.startswith(PLACEHOLDER + ".") or PLACEHOLDER in host[len(PLACEHOLDER) :]:
        raise ConfigError(f"{name}={url!r}: the host must start with {PLACEHOLDER}. ({example}).")
    domain = host[len(PLACEHOLDER) + 1 :]
    if not re.fullmatch(r"[a-z0-9-]+(\.[a-z0-9-]+)*", domain) or (colon and not port.isdigit()):
        raise ConfigError(f"{name}={url!r}: {domain!r} is not a host name ({example}).")
    return AppsOrigin(scheme=parts.scheme, domain=domain, port=f":{port}" if colon else "")


def apps_origin_check(apps: AppsOrigin, *, public_url: str, https: bool, trusted_origins: list[str]) -> None:
    """Refuses settings that would put an app next to the dashboard: the
    dashboard on the apps domain, plain-HTTP apps beside an HTTPS dashboard,
    or a trusted origin (cookie-authenticated writes and websockets) that
    covers the apps domain."""
    if apps.covers(urlsplit(public_url).netloc):
        raise ConfigError(
            f"TRAINYARD_APPS_URL's domain {apps.domain} holds the dashboard ({public_url}): "
            "give apps a domain of their own, e.g. https://{app}.apps.example.com."
        )
    if https and not apps.secure:
        raise ConfigError("TRAINYARD_APPS_URL must be https:// while the dashboard is served over HTTPS.")
    for pattern in trusted_origins:
        if _trusts_apps(pattern, apps):
            raise ConfigError(
                f"DJANGO_CSRF_TRUSTED_ORIGINS entry {pattern!r} covers the apps domain {apps.domain}: "
                "a job's page would be trusted by the dashboard. Narrow it."
            )


def app_label(*, secret: str, attempt_id: str, port: int) -> str:
    """The app's label: HMAC of the attempt and the port under the server's secret."""
    digest = hmac.new(secret.encode(), f"trainyard-app:{attempt_id}:{port}".encode(), hashlib.sha256).digest()
    return base64.b32encode(digest).decode().lower()[:LABEL_LENGTH]


def _trusts_apps(pattern: str, apps: AppsOrigin) -> bool:
    """``pattern`` (``https://host`` or ``https://*.domain``) matches some app's origin."""
    netloc = urlsplit(pattern).netloc
    if not netloc.startswith("*."):
        return apps.covers(netloc)
    wildcard = _hostname(netloc[2:])
    return apps.domain == wildcard or apps.domain.endswith("." + wildcard)


def _hostname(host: str) -> str:
    host = host.strip().lower()
    name = host.partition("]")[0] + "]" if host.startswith("[") else host.partition(":")[0]
    return name.rstrip(".")
