"""The size guard: what a run is about to ship beyond its commit, checked
before anything is uploaded.

Two limits (docs/decisions/0046-cli-downloads-and-ignore.md):

- **soft** (``TRAINYARD_CODE_WARN_SIZE`` or ``trainyard run
  --code-warn-size``, default 20 MiB): over it the CLI lists the largest
  paths and how to leave them out, then asks; with ``--yes``, or without a
  terminal on stdin, it goes on with that warning on stderr;
- **hard** (the server's ``TRAINYARD_MAX_BLOB_BYTES``, from
  ``GET /api/v1/health/``): over it the CLI refuses with the same list. The
  files' total is checked before the patch or archive is built, the built
  blob's size before it is uploaded (a binary patch can be larger than its
  files).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from .code import CodeError, Shipment
from .output import size

WARN_ENV = "TRAINYARD_CODE_WARN_SIZE"
DEFAULT_WARN_BYTES = 20 * 1024 * 1024
LISTED = 10
_UNITS = {
    "": 1, "b": 1,
    "kb": 1000, "mb": 1000**2, "gb": 1000**3,
    "k": 1024, "m": 1024**2, "g": 1024**3,
    "kib": 1024, "mib": 1024**2, "gib": 1024**3,
}  # fmt: skip
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*")


class CodeTooLarge(CodeError):
    """The code is over a limit and nothing was uploaded; ``details`` lists the largest paths."""

    def __init__(self, message: str, details: list[str]) -> None:
        super().__init__(message)
        self.details = details


def parse_size(text: str) -> int:
    """Bytes from ``20MiB``, ``500KB``, ``1.5GB`` or ``1048576``; ValueError
    with the accepted forms otherwise."""
    match = _SIZE.fullmatch(text)
    unit = match[2].lower() if match else ""
    if match is None or unit not in _UNITS:
        raise ValueError(f"{text!r} is not a size: write bytes, or a number with KB, MB, GB, KiB, MiB or GiB (20MiB)")
    return int(float(match[1]) * _UNITS[unit])


@dataclass
class SizeGuard:
    """A ``code.SizeCheck``. ``ask`` (None: do not ask) gets the question and
    returns the answer; ``warn`` prints a warning's lines."""

    warn_bytes: int
    hard_bytes: int | None
    ask: Callable[[str], bool] | None
    warn: Callable[[str, list[str]], None]

    def before_build(self, shipment: Shipment) -> None:
        total = shipment.total
        if self.hard_bytes is not None and total > self.hard_bytes:
            raise CodeTooLarge(
                f"this run would upload {_what(shipment, total)}, more than the server accepts "
                f"({size(self.hard_bytes)}, its TRAINYARD_MAX_BLOB_BYTES); nothing was uploaded",
                listing(shipment),
            )
        if total <= self.warn_bytes:
            return
        self.warn(
            f"this run uploads {_what(shipment, total)}, more than {size(self.warn_bytes)} "
            f"({WARN_ENV} or --code-warn-size)",
            listing(shipment),
        )
        if self.ask is not None and not self.ask(f"Upload {size(total)} with this run?"):
            raise CodeError("nothing was uploaded and no run was submitted (--yes uploads without asking)")

    def built(self, shipment: Shipment, blob_bytes: int) -> None:
        if self.hard_bytes is not None and blob_bytes > self.hard_bytes:
            kind = "patch" if shipment.kind == "patch" else "archive"
            raise CodeTooLarge(
                f"this run's {kind} of {_what(shipment, shipment.total)} is {size(blob_bytes)}, more than the "
                f"server accepts ({size(self.hard_bytes)}, its TRAINYARD_MAX_BLOB_BYTES); nothing was uploaded",
                listing(shipment),
            )


def listing(shipment: Shipment) -> list[str]:
    """The largest paths with their sizes, then how to leave files out."""
    sized = [f for f in shipment.largest(len(shipment.files)) if f.size > 0]
    largest, rest = sized[:LISTED], sized[LISTED:]
    width = max((len(size(f.size)) for f in largest), default=0)
    lines = [f"  {size(f.size):>{width}}  {f.path}" for f in largest]
    if rest:
        lines.append(f"  (and {len(rest)} more file{'s' * (len(rest) != 1)}, {size(sum(f.size for f in rest))})")
    example = "/" + largest[0].path if largest else "/data/"
    hint = "untracked files" if shipment.kind == "patch" else "files"
    lines.append(
        f"Leave {hint} out by listing them in .trainyardignore at the top of the repo (gitignore syntax), "
        f"e.g. `echo '{example}' >> .trainyardignore`"
    )
    return lines


def _what(shipment: Shipment, total: int) -> str:
    if shipment.kind == "patch":
        return f"{size(total)} of uncommitted and untracked files beyond the commit"
    return f"{size(total)} of files in its archive of the working tree"
