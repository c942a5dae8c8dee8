"""Child processes with prefixed, coloured output lines (``web | …``)."""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO

from backend.embedded.processes import groups_stop

COLOURS = {"web": "36", "worker": "33", "beat": "35", "setup": "34", "pytest": "32"}
ALERT_COLOUR = "1;31"
PREFIX_WIDTH = 6
_PR_SET_PDEATHSIG = 1


class Console:
    """Writes whole lines to stdout from several threads, one prefix per source."""

    def __init__(self, stream: IO[str] | None = None) -> None:
        self.stream = stream or sys.stdout
        self.colour = self.stream.isatty() and "NO_COLOR" not in os.environ
        # Reentrant: the signal handler (main thread) may print while the main
        # thread is already inside line().
        self._lock = threading.RLock()

    def line(self, source: str, text: str, *, colour: str | None = None) -> None:
        prefix = f"{source:<{PREFIX_WIDTH}} |"
        if self.colour:
            prefix = f"\x1b[{colour or COLOURS.get(source, '37')}m{prefix}\x1b[0m"
        with self._lock:
            self.stream.write(f"{prefix} {text}\n")
            self.stream.flush()

    def alert(self, text: str) -> None:
        """A line meant to be noticed: a crash, a failed step."""
        message = f"!!! {text}"
        if self.colour:
            message = f"\x1b[{ALERT_COLOUR}m{message}\x1b[0m"
        with self._lock:
            self.stream.write(f"{message}\n")
            self.stream.flush()

    def raw(self, text: str) -> None:
        with self._lock:
            self.stream.write(text)
            self.stream.flush()


class Child:
    """One supervised process in its own session.

    Its own session keeps a terminal Ctrl-C away from it (the supervisor
    decides the order of shutdown) and lets ``stop`` signal the whole process
    group, Celery's pool processes included. Output lines go to the console
    with the child's name as prefix and are kept for ``output``.
    """

    def __init__(
        self, name: str, argv: list[str], *, env: dict[str, str], cwd: Path, console: Console, echo: bool = True
    ) -> None:
        self.name = name
        self.argv = argv
        self.env = env
        self.cwd = cwd
        self.console = console
        self.echo = echo
        self.lines: list[str] = []
        self.process: subprocess.Popen[bytes] | None = None
        self._pump: threading.Thread | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            self.argv,
            cwd=self.cwd,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=_terminate_with_parent(os.getpid()),
        )
        self._pump = threading.Thread(target=self._pump_lines, name=f"pump-{self.name}", daemon=True)
        self._pump.start()

    def poll(self) -> int | None:
        assert self.process is not None
        return self.process.poll()

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def output(self) -> str:
        """Everything the child printed so far (complete after it exited and was drained)."""
        if self._pump is not None and self.poll() is not None:
            self._pump.join(timeout=5)
        return "\n".join(self.lines)

    def _pump_lines(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for raw in self.process.stdout:
            text = raw.decode(errors="replace").rstrip("\r\n")
            self.lines.append(text)
            if self.echo:
                self.console.line(self.name, text)


def _terminate_with_parent(parent_pid: int) -> Callable[[], None]:
    """A preexec_fn asking Linux to SIGTERM the child when the supervisor dies.

    Children run in their own session, so without this a SIGKILLed
    supervisor would leave web, worker and beat running (the next start also
    kills them by pidfile: see ``supervisor._stale_children_kill``).
    """
    libc = ctypes.CDLL(None, use_errno=True)

    def preexec() -> None:
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
        if os.getppid() != parent_pid:  # the supervisor died before prctl
            os._exit(1)

    return preexec


def children_stop(children: list[Child], *, timeout: float) -> None:
    """SIGTERM the process groups of all children at once, SIGKILL them after ``timeout``."""
    started = [child for child in children if child.process is not None]
    groups_stop([child.pid for child in started], timeout=timeout)
    for child in started:
        child.process.wait()  # type: ignore[union-attr]  # reap: no zombies left behind
