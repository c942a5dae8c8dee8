"""Small file helpers for backends that keep their state in a directory
(``local``, ``fake``): atomic writes, an exclusive lock, safe key names."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
from collections.abc import Iterator
from pathlib import Path

# A key becomes a file name: no path separators, no hidden files.
KEY_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def write_atomic(path: Path, text: str) -> None:
    """Replace ``path`` so that a reader sees the old or the new text, never half."""
    tmp = path.with_name(f"{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


@contextlib.contextmanager
def locked(folder: Path) -> Iterator[None]:
    """Hold ``folder/.lock`` exclusively (flock: across processes, and across
    threads of one process). Not re-entrant: never nest two for one folder."""
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield  # closing the file releases the lock


def checked_key(key: str) -> str:
    """``key`` when it is safe as a file name; ``ValueError`` otherwise."""
    if not KEY_PATTERN.fullmatch(key):
        raise ValueError(f"idempotency key {key!r} is not 1-128 letters, digits, '.', '_' or '-'")
    return key
