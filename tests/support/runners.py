"""A runner as the consumer tests play it: its instance row, its socket to
the real ASGI application, and the hello it sends."""

from __future__ import annotations

from channels.testing import WebsocketCommunicator
from trainyard_runner import protocol

from backend.accounts.models import Workspace
from backend.clouds.models import Instance, InstanceStatus
from backend.config.asgi import application
from backend.core.tokens import hash_token

HELLO = protocol.Hello(
    version="test", hostname="box", resources=protocol.Resources(cpus=2, memory_bytes=2**31, disk_bytes=2**33)
)


def runner_instance(team: Workspace, name: str, token: str, *, channel_name: str = "") -> Instance:
    """An idle local runner of ``team`` (2 CPUs, 2 GiB) whose token is ``token``."""
    return Instance.objects.create(
        workspace=team,
        backend="local",
        name=name,
        token_hash=hash_token(token),
        status=InstanceStatus.IDLE,
        cpus=2,
        memory_bytes=2**31,
        channel_name=channel_name,
    )


def runner_socket(token: str) -> WebsocketCommunicator:
    return WebsocketCommunicator(application, "/ws/runner/", headers=[(b"authorization", f"Bearer {token}".encode())])
