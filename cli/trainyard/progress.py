"""Progress of code uploads and artifact downloads: rich bars on stderr when
stderr is a terminal, nothing otherwise (stdout stays the command's output,
and a pipe or a log gets no redraws)."""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    DownloadColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeRemainingColumn,
    TransferSpeedColumn,
)


class Transfers:
    """One display of bars, each a file or an upload by bytes; safe to
    advance from several threads. Without a terminal it draws nothing. It
    starts drawing at its first bar, so a question asked before (the code
    size check's) is not drawn over."""

    def __init__(self, progress: Progress | None) -> None:
        self._progress = progress
        self._lock = threading.Lock()
        self.started = False

    def bar(self, label: str, total: int | None, *, done: int = 0) -> Bar:
        if self._progress is None:
            return Bar(None, None, self._lock)
        with self._lock:
            if not self.started:
                self._progress.start()
                self.started = True
            task = self._progress.add_task(label, total=total, completed=done)
        return Bar(self._progress, task, self._lock)


class Bar:
    def __init__(self, progress: Progress | None, task: TaskID | None, lock: threading.Lock) -> None:
        self._progress, self._task, self._lock = progress, task, lock

    def advance(self, nbytes: int) -> None:
        """Count ``nbytes`` more (fewer when negative: a transfer that starts over)."""
        if self._progress is not None and self._task is not None:
            with self._lock:
                self._progress.advance(self._task, nbytes)

    def done(self) -> None:
        if self._progress is not None and self._task is not None:
            with self._lock:
                self._progress.remove_task(self._task)


@contextmanager
def transfers(*, enabled: bool | None = None) -> Iterator[Transfers]:
    """Bars on stderr for the duration; ``enabled`` None: when stderr is a terminal."""
    if not (sys.stderr.isatty() if enabled is None else enabled):
        yield Transfers(None)
        return
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TimeRemainingColumn(),
        console=Console(file=sys.stderr),
        transient=True,
    )
    shown = Transfers(progress)
    try:
        yield shown
    finally:
        if shown.started:
            progress.stop()
