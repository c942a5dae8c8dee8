"""How a workspace's secrets are hidden in text: logs and status reasons.

A value is hidden wherever it appears as itself or in a form jobs commonly
print it in:

- each of its lines (a PEM key printed by a job arrives as several log lines);
- base64, standard and URL-safe, also wrapped at 76 columns as ``base64``
  prints it, and at each of the three alignments it can have inside a longer
  encoded string (``Authorization: Basic base64(user:token)``);
- URL-encoded (``urllib.parse.quote``, with and without ``/`` kept, and
  ``quote_plus``).

Every occurrence of every form is replaced by ``MASK``; occurrences that
overlap become one mask. Forms shorter than ``MIN_LENGTH`` are not hidden:
a short piece would hide ordinary text everywhere. ``secret_set`` refuses a
value that short.

The text comes from jobs and runners, so masking it takes time linear in its
length, with no pattern that backtracks (docs/decisions/0081-linear-redaction.md):
substring searches, and one Python step per mask placed, not per
occurrence (``spans``).
"""

from __future__ import annotations

import base64
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import quote, quote_plus

MASK = "*****"
MIN_LENGTH = 4
# Values of 3 characters were accepted before MIN_LENGTH was 4; they stay
# masked as a whole, as they were.
_OLD_MIN_LENGTH = 3
_BASE64_COLUMNS = 76  # where coreutils' base64 wraps its output
# Telling whether a text holds a form costs one substring search per
# detector (about 50 µs per 250 KB). A long value has many long detectors
# (its lines, its wrapped base64): past _DIRECT_MAX of them, the long ones
# are found instead by looking up the text's _GRAM-character grams at every
# _STRIDE-th position, which costs about as much as _DIRECT_MAX searches
# whatever their number. A detector of at least _STRIDE + _GRAM - 1
# characters covers one such position wherever it occurs, and its gram
# there is one of its first _STRIDE grams.
_GRAM = 12
_STRIDE = 48
_DIRECT_MAX = 10
_BLOCK = 1 << 16  # characters compared at once while measuring a run of a self-overlapping form
_SAMPLE = re.compile(rf"(?s)(.{{{_GRAM}}}).{{0,{_STRIDE - _GRAM}}}")  # the gram at 0, _STRIDE, 2 * _STRIDE, …

Span = tuple[int, int]


@dataclass(frozen=True)
class Masks:
    """The forms of a workspace's secrets, built once per change of them."""

    forms: tuple[str, ...] = ()  # every string to hide, longest first
    periods: tuple[int, ...] = ()  # each form's smallest period (``_period``), in the order of ``forms``
    # Every form contains a detector, so they alone decide whether a text
    # needs masking: searched for directly, or (many long ones) by grams.
    detectors: tuple[str, ...] = ()
    grams: frozenset[str] = field(default_factory=frozenset)

    def __bool__(self) -> bool:
        return bool(self.forms)

    def found_in(self, text: str) -> bool:
        if any(detector in text for detector in self.detectors):
            return True
        return bool(self.grams) and not self.grams.isdisjoint(_SAMPLE.findall(text))


def masks_of(values: Iterable[str]) -> Masks:
    forms: set[str] = set()
    detectors: set[str] = set()
    for value in values:
        value_forms, value_detectors = _forms(value)
        forms |= value_forms
        detectors |= value_detectors
    ordered = tuple(sorted(forms, key=lambda f: (-len(f), f)))
    periods = tuple(map(_period, ordered))
    long = sorted(d for d in detectors if len(d) >= _STRIDE + _GRAM - 1)
    if len(long) <= _DIRECT_MAX:
        return Masks(ordered, periods, tuple(sorted(detectors)))
    grams = frozenset(d[i : i + _GRAM] for d in long for i in range(_STRIDE))
    return Masks(ordered, periods, tuple(sorted(detectors - set(long))), grams)


def mask(text: str, masks: Masks, *, cut: bool = False) -> str:
    """``text`` with every form hidden. ``cut``: the text was cut short, so
    its end may be the start of a form; that end is hidden too."""
    found = spans(text, masks) if masks.found_in(text) else []
    if cut:
        found += end_spans(text, masks)
    return cover(text, found)


def spans(text: str, masks: Masks) -> list[Span]:
    """Where the forms occur in ``text``. Occurrences of a form that overlap
    come as one span, their union: ``cover`` hides them with one mask either
    way, and a long run of them (``aaaa…`` for a form ``aaaa``) costs one step,
    not one per occurrence."""
    found: list[Span] = []
    periods = masks.periods or tuple(map(_period, masks.forms))
    for form, period in zip(masks.forms, periods, strict=True):
        found += _occurrences(text, form, period)
    return found


def _occurrences(text: str, form: str, period: int) -> list[Span]:
    """The spans of ``form`` in ``text``, each run of overlapping occurrences
    as one. Two occurrences overlap only ``period`` (the form's smallest
    period) or a multiple of it apart, inside a stretch of text that repeats
    the form's first ``period`` characters: that stretch is measured at C
    speed (``_repeats``), and the search goes on after its last occurrence."""
    found: list[Span] = []
    length = len(form)
    start = text.find(form)
    if period == length:  # it never overlaps itself
        while start != -1:
            found.append((start, start + length))
            start = text.find(form, start + length)
        return found
    unit = form[:period]
    whole, rest = divmod(length, period)  # form == unit * whole + unit[:rest]
    while start != -1:
        first = start
        while True:
            units = _repeats(text, unit, start)
            # The occurrences from ``start`` are ``period`` apart while the
            # units last; the last one may end in a part of a unit.
            extra = units - whole if text.startswith(unit[:rest], start + units * period) else units - whole - 1
            last = start + extra * period
            start = text.find(form, last + 1)
            if start == -1 or start >= last + length:  # the next one does not overlap this run
                break
        found.append((first, last + length))
    return found


def _repeats(text: str, unit: str, at: int) -> int:
    """How many times ``unit`` repeats in ``text`` from ``at``: compared in
    blocks of 1, 2, 4, … units (at most _BLOCK characters), then halving."""
    count, size, block = 0, 1, unit
    while text.startswith(block, at):
        at += len(block)
        count += size
        if len(block) < _BLOCK:
            size, block = size * 2, block + block
    while size > 1:
        size //= 2
        block = block[: len(block) // 2]
        if text.startswith(block, at):
            at += len(block)
            count += size
    return count


def _period(form: str) -> int:
    """The smallest p > 0 with form[i] == form[i + p] wherever both exist
    (``len(form)`` when the form never overlaps itself): its length less its
    longest proper border (Knuth–Morris–Pratt's failure function)."""
    border = [0] * len(form)
    k = 0
    for i in range(1, len(form)):
        while k and form[i] != form[k]:
            k = border[k - 1]
        if form[i] == form[k]:
            k += 1
        border[i] = k
    return len(form) - (border[-1] if form else 0)


def end_spans(text: str, masks: Masks) -> list[Span]:
    """The end of ``text`` that is a proper start of a form, at least
    MIN_LENGTH long (the longest such end), or nothing."""
    if len(text) < MIN_LENGTH:
        return []
    last = text[-MIN_LENGTH:]
    longest = 0
    for form in masks.forms:
        # Each place the text's last characters occur in the form, short of
        # its end, is where the text may stop inside the form.
        at = form.find(last, 0, len(form) - 1)
        while at != -1:
            stop = at + MIN_LENGTH
            if stop > longest and _ends_with(text, form[:stop]):
                longest = stop
            at = form.find(last, at + 1, len(form) - 1)
    return [(len(text) - min(longest, len(text)), len(text))] if longest else []


def start_candidates(text: str, masks: Masks) -> list[tuple[str, int, Span]]:
    """(form, at, span) for each form whose end ``form[at:]`` (at ≥ 1, at
    least MIN_LENGTH long) ``text`` starts with; ``span`` is its place in the
    text. Costs one search of each form, no database: a cheap first test."""
    first = text[:MIN_LENGTH]
    if len(first) < MIN_LENGTH:
        return []
    found = []
    for form in masks.forms:
        at = form.find(first, 1)
        while at != -1:
            length = min(len(form) - at, len(text))
            if text[:length] == form[at : at + length]:
                found.append((form, at, (0, length)))
            at = form.find(first, at + 1)
    return found


def cover(text: str, found: list[Span]) -> str:
    """``text`` with each span replaced by MASK; overlapping spans become one
    mask, adjacent ones stay two (a value printed twice reads as two masks)."""
    if not found:
        return text
    parts = []
    done = 0  # text[:done] is written
    for start, stop in sorted(found):
        if start < done:
            done = max(done, stop)
            continue
        parts += [text[done:start], MASK]
        done = stop
    parts.append(text[done:])
    return "".join(parts)


def continues(before: str, head: str) -> bool:
    """Whether ``before`` (a text cut short) may end with ``head``, the start
    of a form whose end the next text starts with: it ends with ``head``, or
    with a mask (its end was hidden as a possible start of a form, see
    ``end_spans``)."""
    return before.endswith(MASK) or _ends_with(before, head)


def _ends_with(text: str, head: str) -> bool:
    """``text`` ends with ``head``, or with as much of it as it holds."""
    length = min(len(text), len(head))
    return text[len(text) - length :] == head[len(head) - length :]


def _forms(value: str) -> tuple[set[str], set[str]]:
    """(forms, detectors) of one value: every form contains a detector."""
    raw = value.encode()
    lines = _lines(value)
    encoded = {quote(value), quote(value, safe=""), quote_plus(value)}
    wholes, cores, wrapped = _base64_forms(raw)
    forms = {*lines, *encoded, *wholes, *cores, *wrapped}
    # The value contains its lines; each whole encoding starts with the
    # first core (its whole 3-byte groups), or is wrapped into pieces.
    detectors = {*lines, *encoded, *cores, *wrapped}
    forms = {form for form in forms if len(form) >= MIN_LENGTH}
    detectors = {detector for detector in detectors if len(detector) >= MIN_LENGTH}
    if len(value) >= _OLD_MIN_LENGTH:
        forms.add(value)
        if not any(len(line) >= MIN_LENGTH for line in lines) or len(lines) == 1:
            detectors.add(value)  # no line of it is a detector
    return forms, detectors


def _lines(value: str) -> list[str]:
    # The runner splits output on "\n"; a value written with "\r\n" arrives
    # with "\r" at the end of each piece, the masked piece leaves it.
    return [line.rstrip("\r") for line in value.split("\n")] if "\n" in value else [value]


def _base64_forms(raw: bytes) -> tuple[set[str], set[str], set[str]]:
    """(whole encodings, cores, pieces of wrapped encodings)."""
    wholes: set[str] = set()
    cores: set[str] = set()
    for encode in (base64.b64encode, base64.urlsafe_b64encode):
        for data in (raw, raw + b"\n"):  # `echo "$TOKEN" | base64` encodes the newline
            wholes.add(encode(data).decode())
        # Inside a longer encoded string the value starts 0, 1 or 2 bytes
        # into a 3-byte group: the groups that hold only its bytes encode
        # the same whatever surrounds them.
        for skip in range(3):
            body = raw[skip:]
            cores.add(encode(body[: len(body) // 3 * 3]).decode())
    wrapped: set[str] = set()
    for data in (raw, raw + b"\n"):  # as `base64` prints it (standard alphabet only)
        whole = base64.b64encode(data).decode()
        if len(whole) > _BASE64_COLUMNS:
            wrapped.update(whole[i : i + _BASE64_COLUMNS] for i in range(0, len(whole), _BASE64_COLUMNS))
    return wholes, cores, wrapped
