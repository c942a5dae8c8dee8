"""The web process's pulse: written every few seconds, through the same
database thread the runner connections use, from the event loop that serves
them. If the process is frozen, its event loop stalls or its database thread
hangs, the pulse stops, and the reconciler counts no runner's silence for
that time (``clouds.services.reconcile.hearing``).

The pulse starts with the ASGI lifespan. A server that sends none (uvicorn
``--lifespan off``, a server without lifespan support) starts it with its
first request instead, and logs a warning saying so: never a process that
serves runners without a pulse."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

from channels.db import database_sync_to_async

from backend.clouds.services.reconcile import web_pulse

logger = logging.getLogger(__name__)

PULSE_SECONDS = 3.0
NO_LIFESPAN = (
    "this server sent no ASGI lifespan startup: the pulse that lets the reconciler detect lost runners "
    "starts with this first request instead (serve with lifespan on, e.g. uvicorn --lifespan on)"
)

# This process's pulse and companion loops, once started (by the lifespan or a first request).
_running: list[asyncio.Task[None]] = []


async def serve_lifespan(
    receive: Any, send: Any, *, also: Sequence[Callable[[], Coroutine[Any, Any, None]]] = ()
) -> None:
    """ASGI lifespan: start the pulse (and the loops in ``also``) at startup, stop them at shutdown."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            _start(also)
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            tasks, _running[:] = list(_running), []
            for task in tasks:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await send({"type": "lifespan.shutdown.complete"})
            return


def pulse_without_lifespan(
    scope: Mapping[str, Any], *, also: Sequence[Callable[[], Coroutine[Any, Any, None]]] = ()
) -> None:
    """Called with every request: if no lifespan started the pulse, start it
    now and say so. Only for a request a server received (its scope names
    the ``server``): an application called in-process (a test harness) runs
    in event loops that end with the call, where no pulse belongs."""
    if _running or scope.get("server") is None:
        return
    logger.warning(NO_LIFESPAN)
    _start(also)


def _start(loops: Sequence[Callable[[], Coroutine[Any, Any, None]]]) -> None:
    _running[:] = [asyncio.create_task(loop()) for loop in (pulse_forever, *loops)]


async def pulse_forever() -> None:
    process = f"{socket.gethostname()}:{os.getpid()}"[:100]
    while True:
        try:
            await database_sync_to_async(web_pulse)(process=process)
        except Exception:  # the database is down: no pulse is the signal
            logger.warning("could not write this web process's pulse", exc_info=True)
        await asyncio.sleep(PULSE_SECONDS)
