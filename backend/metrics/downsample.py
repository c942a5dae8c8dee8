"""Fewer points for a chart: a series cut to at most ``points`` per series
(docs/METRICS.md). System series are bucketed by time into the smallest of
``WIDTHS`` that fits (min of mins, max of maxes, mean weighted by samples);
training series are averaged over runs of consecutive values of one
attempt. A bucket never mixes two attempts, so an attempt boundary stays
where it was."""

from __future__ import annotations

import math
import operator
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field

# Bucket widths in seconds: a chart's resolution reads as one of these.
WIDTHS = (5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 21600, 43200, 86400)


@dataclass
class TimePoints:
    """A system series: per point its time, mean, min, max, samples and
    attempt, in time order within each attempt; a missing value is NaN."""

    x: list[float] = field(default_factory=list)
    y: list[float] = field(default_factory=list)
    low: list[float] = field(default_factory=list)
    high: list[float] = field(default_factory=list)
    n: list[int] = field(default_factory=list)
    attempt: list[int] = field(default_factory=list)
    minutes: bool = False  # some points are per-minute aggregates

    def extend(
        self, x: list[float], y: list[float], low: list[float], high: list[float], n: list[int], attempt: int
    ) -> None:
        self.x += x
        self.y += y
        self.low += low
        self.high += high
        self.n += n
        self.attempt += [attempt] * len(x)

    def without_missing(self) -> TimePoints:
        keep = [i for i, v in enumerate(self.y) if v == v]  # NaN is not equal to itself
        if len(keep) == len(self.y):
            return self
        out = TimePoints(minutes=self.minutes)
        for name in ("x", "y", "low", "high", "n", "attempt"):
            column = getattr(self, name)
            setattr(out, name, [column[i] for i in keep])
        return out


def bucket_width(span: float, points: int, finest: float) -> float:
    """The smallest width of WIDTHS (not under ``finest``) that makes ``span``
    seconds at most ``points`` buckets; 0 when the points fit as they are."""
    for width in WIDTHS:
        if width >= finest and span / width <= points - 1:
            return float(width)
    return float(WIDTHS[-1])


def by_time(points: TimePoints, width: float) -> TimePoints:
    """``points`` (attempts in order, each one's times in order) in buckets
    of ``width`` seconds, never across attempts: the
    mean weighted by samples, the min of mins and max of maxes. Each bucket
    is a slice summed and compared by Python's builtins; only a bucket with
    a missing value is walked point by point."""
    out = TimePoints(minutes=points.minutes)
    x, y, low, high, n, attempt = points.x, points.y, points.low, points.high, points.n, points.attempt
    i, size = 0, len(x)
    while i < size:
        start = math.floor(x[i] / width) * width
        end = bisect_right(attempt, attempt[i], i, size)  # attempts come in order, times in order within one
        j = max(bisect_left(x, start + width, i, end), i + 1)
        ys, ns = y[i:j], n[i:j]
        weighted = sum(map(operator.mul, ys, ns))
        if weighted == weighted:
            total = sum(ns)
            out.x.append(start)
            out.y.append(weighted / total)
            out.low.append(min(low[i:j]))
            out.high.append(max(high[i:j]))
            out.n.append(total)
            out.attempt.append(attempt[i])
        else:
            kept = [m for m in range(i, j) if y[m] == y[m]]
            if kept:
                total = sum(n[m] for m in kept)
                out.x.append(start)
                out.y.append(sum(y[m] * n[m] for m in kept) / total)
                out.low.append(min(low[m] for m in kept))
                out.high.append(max(high[m] for m in kept))
                out.n.append(total)
                out.attempt.append(attempt[i])
        i = j
    return out


def by_runs(
    x: list[float], y: list[float], attempt: list[int], t: list[float], points: int
) -> tuple[list[float], list[float], list[int], list[float]]:
    """Values averaged over runs of ``ceil(n / points)`` consecutive ones of
    one attempt, each at its run's last x and time; as they are when they fit."""
    if len(x) <= points:
        return x, y, attempt, t
    size = math.ceil(len(x) / points)
    ox: list[float] = []
    oy: list[float] = []
    oa: list[int] = []
    ot: list[float] = []
    start = 0
    while start < len(x):
        end = start
        while end < len(x) and end - start < size and attempt[end] == attempt[start]:
            end += 1
        ox.append(x[end - 1])
        oy.append(sum(y[start:end]) / (end - start))
        oa.append(attempt[start])
        ot.append(t[end - 1])
        start = end
    if len(ox) > points:  # many attempt boundaries: take every k-th run
        keep = range(0, len(ox), math.ceil(len(ox) / points))
        ox, oy, oa, ot = [ox[i] for i in keep], [oy[i] for i in keep], [oa[i] for i in keep], [ot[i] for i in keep]
    return ox, oy, oa, ot
