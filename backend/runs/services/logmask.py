"""Masking a batch of log lines before it is stored or streamed.

Secrets are hidden in the lines' raw text, before it is escaped for COPY
(``backend/vault/masking.py`` says which forms of a value are hidden). A
value can also reach the server in pieces: the runner cuts a line longer
than MAX_LINE_BYTES, and the next line of the same stream continues it
(``protocol.may_be_cut``). So the lines of a stream joined by cuts are
masked as one text, a *chain*, and each mask is cut where the line was.
Two cases reach beyond the batch:

1. A chain that ends the batch with a cut: what follows is not here yet, so
   its end is hidden if it is the start of a form (``end_spans``).
2. A stream's first chain may continue a cut line an earlier batch stored:
   its start is hidden if it is the end of a form and that line ends with
   the rest of the form or with a mask (``start_candidates``,
   ``continues``). The earlier line is read only in that case.

``needs_masking`` tells whether a batch needs any of this with one
substring search per detector over the batch's joined text and a few
checks per batch, so the common batch (no secret in it) is stored as it was
prepared; for a workspace without secrets it does nothing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from operator import indexOf, itemgetter

from trainyard_runner.protocol import CUT_MIN_CHARS, LogLineWire, may_be_cut

from backend.vault.masking import Masks, Span, continues, cover, end_spans, spans, start_candidates

# The stored line a stream's first line in a batch may continue: its text if
# it may have been cut (``logs._previous`` says when), else None.
Previous = Callable[[str], str | None]


def needs_masking(text: str, lines: list[LogLineWire], masks: Masks, previous: Previous) -> bool:
    """Whether ``lines`` (``text``: their texts joined by "\\n") need ``masked``.
    Nothing but C-level passes over the batch; nothing at all for a
    workspace without secrets."""
    if not masks:
        return False
    if masks.found_in(text) or _may_hold_a_cut(text, lines):
        return True  # a form in a line, or a line that may be cut (rare: always the careful path)
    return any(_start(lines[i][1], lines[i][2], masks, previous) for i in _firsts(lines))


def masked(lines: list[LogLineWire], masks: Masks, previous: Previous) -> list[LogLineWire]:
    """The lines with every form hidden, followed across cuts."""
    texts = [text for _, _, text in lines]
    for chain, first, open_end in _chains(lines):
        joined = "".join(texts[i] for i in chain)
        found = spans(joined, masks) if masks.found_in(joined) else []
        if first:
            found += _start(lines[chain[0]][1], joined, masks, previous)
        if open_end:
            found += end_spans(joined, masks)
        for i, text in zip(chain, _pieces(joined, [len(texts[i]) for i in chain], found), strict=True):
            texts[i] = text
    return [(ts, stream, text) for (ts, stream, _), text in zip(lines, texts, strict=True)]


def _start(stream: str, text: str, masks: Masks, previous: Previous) -> list[Span]:
    """The start of a stream's first line (or chain) to hide because it ends a
    form begun by the cut line stored before it."""
    candidates = start_candidates(text, masks)
    if not candidates:
        return []
    before = previous(stream)
    if before is None:
        return []
    return [span for form, at, span in candidates if continues(before, form[:at])]


def _may_hold_a_cut(text: str, lines: list[LogLineWire]) -> bool:
    """Whether a line may be a cut piece. A piece is at least CUT_MIN_CHARS
    long, so it covers a whole window of half that length, which then holds
    no "\\n" of ``text``; a few searches rule out most batches."""
    window = CUT_MIN_CHARS // 2
    starts = range(0, len(text) - window + 1, window)
    if all(text.find("\n", start, start + window) != -1 for start in starts):
        return False
    return any(map(may_be_cut, map(itemgetter(2), lines)))


def _firsts(lines: list[LogLineWire]) -> list[int]:
    """The index of each stream's first line."""
    found = []
    for stream in ("o", "e"):
        with contextlib.suppress(ValueError):
            found.append(indexOf(map(itemgetter(1), lines), stream))
    return found


def _chains(lines: list[LogLineWire]) -> list[tuple[list[int], bool, bool]]:
    """(indices, first of its stream in the batch, ends with a cut) for each
    run of lines of one stream joined by cuts."""
    chains: list[tuple[list[int], bool, bool]] = []
    growing: dict[str, list[int]] = {}
    seen: set[str] = set()
    for i, (_, stream, text) in enumerate(lines):
        growing.setdefault(stream, []).append(i)
        if not may_be_cut(text):
            chains.append((growing.pop(stream), stream not in seen, False))
            seen.add(stream)
    chains += [(chain, stream not in seen, True) for stream, chain in growing.items()]
    return chains


def _pieces(joined: str, lengths: list[int], found: list[Span]) -> list[str]:
    """``joined`` cut back into pieces of ``lengths``, each masked where a
    span covers part of it (a span across a cut masks both sides)."""
    pieces = []
    offset = 0
    for length in lengths:
        end = offset + length
        mine = [(max(a, offset) - offset, min(b, end) - offset) for a, b in found if a < end and b > offset]
        pieces.append(cover(joined[offset:end], mine))
        offset = end
    return pieces
