"""The bytes of a block: plain arrays, little-endian, one after another,
compressed with zlib. Times are float64 Unix seconds, steps int64, training
values float64, system values float32 (seven significant digits: a chart's
precision, half the bytes); a missing value is NaN. The block's row keeps
the count and the series' names, so the bytes carry no header.

- raw samples: ``t[n]``, then per series ``v[n]``
- per minute:  ``t[n]`` (the minute's start), ``count[n]`` (uint16), then per
  series ``min[n]``, ``mean[n]``, ``max[n]``
- training:    ``t[n]``, ``step[n]`` (only when keyed by step), ``v[n]``
"""

from __future__ import annotations

import math
import sys
import zlib
from array import array
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

NAN = math.nan
_LEVEL = 6


def at(t: float) -> datetime:
    """A Unix time as an aware datetime (UTC)."""
    return datetime.fromtimestamp(t, tz=UTC)


def _pack(typecode: str, values: Iterable[float | int]) -> bytes:
    arr = array(typecode, values)
    if sys.byteorder == "big":
        arr.byteswap()
    return arr.tobytes()


def _unpack(typecode: str, raw: bytes | memoryview, offset: int, n: int) -> tuple[list[float] | list[int], int]:
    arr = array(typecode)
    end = offset + n * arr.itemsize
    arr.frombytes(bytes(raw[offset:end]))
    if sys.byteorder == "big":
        arr.byteswap()
    return arr.tolist(), end


@dataclass
class Samples:
    """Raw samples: times in order and, per series, one value per time."""

    t: list[float] = field(default_factory=list)
    values: dict[str, list[float]] = field(default_factory=dict)

    def encode(self) -> bytes:
        parts = [_pack("d", self.t)] + [_pack("f", self.values[name]) for name in self.values]
        return zlib.compress(b"".join(parts), _LEVEL)

    @classmethod
    def decode(cls, data: bytes | memoryview, names: Sequence[str], count: int) -> Samples:
        raw = zlib.decompress(bytes(data))
        t, offset = _unpack("d", raw, 0, count)
        values = {}
        for name in names:
            values[name], offset = _unpack("f", raw, offset, count)
        return cls(t=[float(x) for x in t], values={k: [float(x) for x in v] for k, v in values.items()})


@dataclass
class Minutes:
    """Per minute: its start, how many samples, and per series min, mean, max
    (NaN where none of the minute's samples had the series)."""

    t: list[float] = field(default_factory=list)
    count: list[int] = field(default_factory=list)
    low: dict[str, list[float]] = field(default_factory=dict)
    mean: dict[str, list[float]] = field(default_factory=dict)
    high: dict[str, list[float]] = field(default_factory=dict)

    def encode(self) -> bytes:
        parts = [_pack("d", self.t), _pack("H", self.count)]
        for name in self.mean:
            parts += [_pack("f", self.low[name]), _pack("f", self.mean[name]), _pack("f", self.high[name])]
        return zlib.compress(b"".join(parts), _LEVEL)

    @classmethod
    def decode(cls, data: bytes | memoryview, names: Sequence[str], count: int) -> Minutes:
        raw = zlib.decompress(bytes(data))
        t, offset = _unpack("d", raw, 0, count)
        counts, offset = _unpack("H", raw, offset, count)
        out = cls(t=[float(x) for x in t], count=[int(c) for c in counts])
        for name in names:
            low, offset = _unpack("f", raw, offset, count)
            mean, offset = _unpack("f", raw, offset, count)
            high, offset = _unpack("f", raw, offset, count)
            out.low[name], out.mean[name], out.high[name] = low, mean, high  # type: ignore[assignment]
        return out


@dataclass
class Values:
    """One training metric's values: times, steps (None: keyed by time), values."""

    t: list[float] = field(default_factory=list)
    step: list[int] | None = None
    v: list[float] = field(default_factory=list)

    def encode(self) -> bytes:
        parts = [_pack("d", self.t)]
        if self.step is not None:
            parts.append(_pack("q", self.step))
        parts.append(_pack("d", self.v))
        return zlib.compress(b"".join(parts), _LEVEL)

    @classmethod
    def decode(cls, data: bytes | memoryview, count: int, *, by_step: bool) -> Values:
        raw = zlib.decompress(bytes(data))
        t, offset = _unpack("d", raw, 0, count)
        step = None
        if by_step:
            step, offset = _unpack("q", raw, offset, count)
        v, offset = _unpack("d", raw, offset, count)
        return cls(t=t, step=step, v=v)  # type: ignore[arg-type]


def minutes_of(samples: Samples, into: Minutes | None = None) -> Minutes:
    """``samples`` aggregated per minute, merged with ``into``'s minutes
    (counts add up, the mean is weighted by them, min and max combine)."""
    acc: dict[float, dict[str, list[float]]] = {}  # minute -> name -> [n, min, sum, max]
    counts: dict[float, int] = {}
    if into is not None:
        for i, start in enumerate(into.t):
            counts[start] = into.count[i]
            acc[start] = {}
            for name in into.mean:
                mean = into.mean[name][i]
                if not math.isnan(mean):
                    acc[start][name] = [into.count[i], into.low[name][i], mean * into.count[i], into.high[name][i]]
    for i, t in enumerate(samples.t):
        start = math.floor(t / 60) * 60.0
        counts[start] = counts.get(start, 0) + 1
        row = acc.setdefault(start, {})
        for name, column in samples.values.items():
            value = column[i]
            if math.isnan(value):
                continue
            cell = row.get(name)
            if cell is None:
                row[name] = [1, value, value, value]
            else:
                cell[0] += 1
                cell[1] = min(cell[1], value)
                cell[2] += value
                cell[3] = max(cell[3], value)
    names = list(dict.fromkeys([*(into.mean if into else []), *samples.values]))
    out = Minutes()
    for start in sorted(counts):
        out.t.append(start)
        out.count.append(min(counts[start], 65535))
        for name in names:
            cell = acc.get(start, {}).get(name)
            out.low.setdefault(name, []).append(cell[1] if cell else NAN)
            out.mean.setdefault(name, []).append(cell[2] / cell[0] if cell else NAN)
            out.high.setdefault(name, []).append(cell[3] if cell else NAN)
    return out


def merge_samples(parts: Iterable[Samples]) -> Samples:
    """Samples of several blocks as one, ordered by time; of samples at the
    same time the first is kept. A series missing from a part is NaN there."""
    parts = list(parts)
    names = list(dict.fromkeys(name for part in parts for name in part.values))
    rows: dict[float, dict[str, float]] = {}
    for part in parts:
        for i, t in enumerate(part.t):
            if t in rows:
                continue
            rows[t] = {name: column[i] for name, column in part.values.items()}
    out = Samples(t=sorted(rows))
    out.values = {name: [rows[t].get(name, NAN) for t in out.t] for name in names}
    return out
