"""``ports: N``: N free TCP ports of the machine for one job, given to it as
``PORT_0`` … ``PORT_{N-1}`` (as dstack 0.x did) and named in the runner's
``JobAccepted`` so the server can show them.

A port is free when it can be bound on every interface now; all N sockets
are held open until the N are chosen, so they differ. Nothing reserves a
port between the choice and the job's own bind; the kernel hands out bound
ports in its ephemeral range, which outbound connections also use, but a
port held by a listening socket is never handed out again, and the job
binds within seconds.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Mapping


def free_ports(count: int) -> list[int]:
    """``count`` distinct free ports; raises OSError when there are not as many."""
    with contextlib.ExitStack() as held:
        ports = []
        for _ in range(count):
            sock = held.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind(("0.0.0.0", 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def port_env(ports: list[int]) -> dict[str, str]:
    return {f"PORT_{i}": str(port) for i, port in enumerate(ports)}


def ports_of(env: Mapping[str, str], count: int) -> list[int]:
    """The ports ``port_env`` put in ``env`` ([] when they are not there)."""
    try:
        return [int(env[f"PORT_{i}"]) for i in range(count)]
    except (KeyError, ValueError):
        return []
