"""Downsampling for charts: buckets by time never mix attempts, weigh
per-minute means by their samples, keep every minimum and maximum, and
leave missing values out; training values averaged over runs of one attempt."""

from __future__ import annotations

import math

from backend.metrics.downsample import TimePoints, bucket_width, by_runs, by_time

NAN = math.nan


def test_buckets_weigh_means_keep_extremes_and_never_mix_attempts() -> None:
    points = TimePoints()
    points.extend([0.0, 60.0, 120.0], [10.0, 40.0, 7.0], [5.0, 1.0, 7.0], [20.0, 90.0, 7.0], [12, 6, 1], 1)
    points.extend([150.0, 170.0], [NAN, 3.0], [NAN, 2.0], [NAN, 4.0], [1, 1], 2)

    out = by_time(points, 300.0)

    assert out.x == [0.0, 0.0] and out.attempt == [1, 2]  # the same bucket, two attempts: two points
    assert out.y[0] == (10 * 12 + 40 * 6 + 7) / 19 and (out.low[0], out.high[0], out.n[0]) == (1.0, 90.0, 19)
    assert (out.y[1], out.low[1], out.high[1], out.n[1]) == (3.0, 2.0, 4.0, 1)  # the missing value left out


def test_a_series_without_a_value_in_a_bucket_has_no_point_there() -> None:
    points = TimePoints()
    points.extend([0.0, 5.0, 600.0], [NAN, NAN, 1.0], [NAN, NAN, 1.0], [NAN, NAN, 1.0], [1, 1, 1], 1)
    assert by_time(points, 60.0).x == [600.0]
    assert points.without_missing().x == [600.0]


def test_the_width_is_the_smallest_that_fits() -> None:
    assert bucket_width(7 * 86400, 1000, 60) == 900  # a week in 1,000 points: 15 minutes
    assert bucket_width(3600, 1000, 0) == 5
    assert bucket_width(155, 4, 60) == 60


def test_training_values_are_averaged_over_runs_of_one_attempt() -> None:
    x = [float(s) for s in range(10)]
    y = [float(s) for s in range(10)]
    attempt = [1] * 5 + [2] * 5
    # Runs of 3 at most, cut where attempt 2 starts: 0-2, 3-4 | 5-7, 8-9; each at its last x.
    assert by_runs(x, y, attempt, x, 4) == (
        [2.0, 4.0, 7.0, 9.0],
        [1.0, 3.5, 6.0, 8.5],
        [1, 1, 2, 2],
        [2.0, 4.0, 7.0, 9.0],
    )
    assert by_runs(x, y, attempt, x, 20) == (x, y, attempt, x)
