"""Whether the server may connect to a host a user named (an ``https://``
data input, a webhook): only when every address the host resolves to is
public, or lies in a network the installation allows. Otherwise a workflow
or a subscription could make the server probe its own network (loopback,
private, link-local such as the cloud metadata address, …).

The caller connects to the address returned, the one that was checked, so
no second lookup can answer another.
"""

from __future__ import annotations

import http.client
import ipaddress
import socket
import ssl
from collections.abc import Sequence

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


class AddressRefused(Exception):
    """The host may not be reached. ``str()`` says why ("its host resolves to
    127.0.0.1, a loopback address"); ``not_public`` is True when an allowed
    network would have let it through (the caller names its setting)."""

    def __init__(self, message: str, *, not_public: bool) -> None:
        super().__init__(message)
        self.not_public = not_public


def public_address(host: str, port: int, *, allowed: Sequence[str]) -> str:
    """The address to connect to for ``host``; ``AddressRefused`` when it
    does not resolve, or when any address it resolves to is not public and
    lies in none of the ``allowed`` networks (CIDR)."""
    try:
        found = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as e:
        raise AddressRefused(f"could not resolve {host} ({e})", not_public=False) from None
    networks = [ipaddress.ip_network(n, strict=False) for n in allowed]
    addresses = [str(info[4][0]) for info in found]
    for text in addresses:
        address = ipaddress.ip_address(text.partition("%")[0])
        if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
            address = address.ipv4_mapped
        kind = not_public(address)
        if kind and not any(address in network for network in networks):
            raise AddressRefused(f"its host resolves to {address}, {kind} address", not_public=True)
    if not addresses:
        raise AddressRefused(f"{host} resolves to no address", not_public=False)
    return addresses[0]


def not_public(address: Address) -> str:
    """ "a loopback", "a private", … for an address that is not public; "" for a public one."""
    if address.is_unspecified:
        return "an unspecified"
    if address.is_loopback:
        return "a loopback"
    if address.is_link_local:
        return "a link-local"
    if address.is_multicast:
        return "a multicast"
    if address.is_reserved:
        return "a reserved"
    if address.is_private:
        return "a private"
    if not address.is_global:
        return "a reserved"
    return ""


class PinnedHTTPSConnection(http.client.HTTPSConnection):
    """An HTTPS connection to ``host`` made at ``address`` (the address that
    was checked), with the certificate verified for ``host``."""

    def __init__(self, host: str, port: int, *, address: str, timeout: float) -> None:
        self._tls = ssl.create_default_context()
        super().__init__(host, port, timeout=timeout, context=self._tls)
        self._address = address

    def connect(self) -> None:
        sock = socket.create_connection((self._address, self.port), self.timeout)
        self.sock = self._tls.wrap_socket(sock, server_hostname=self.host)


class PinnedHTTPConnection(http.client.HTTPConnection):
    """A plain HTTP connection to ``host`` made at ``address`` (the address that was checked)."""

    def __init__(self, host: str, port: int, *, address: str, timeout: float) -> None:
        super().__init__(host, port, timeout=timeout)
        self._address = address

    def connect(self) -> None:
        self.sock = socket.create_connection((self._address, self.port), self.timeout)
