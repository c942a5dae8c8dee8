"""Log frames as followers get them (``{"type": "logs", "job", "first_seq",
"streams", "times", "text"}``), read back into lines for assertions."""

from __future__ import annotations

from typing import Any

from trainyard_runner.protocol import chunk_fields, chunk_lines


def frame_lines(frame: dict[str, Any]) -> list[list[Any]]:
    """[seq, time, stream, text] of every line of a follower's ``logs`` frame."""
    first = frame["first_seq"]
    return [[first + i, *line] for i, line in enumerate(chunk_lines(frame["streams"], frame["times"], frame["text"]))]


def logs_frame(job: str, lines: list[list[Any]]) -> dict[str, Any]:
    """The follower frame of consecutive lines ([seq, time, stream, text] each)."""
    streams, times, text = chunk_fields([(ts, stream, t) for _, ts, stream, t in lines])
    runs = [list(run) for run in times]  # as JSON gives them
    return {"type": "logs", "job": job, "first_seq": lines[0][0], "streams": streams, "times": runs, "text": text}


def frame_span(frame: dict[str, Any]) -> tuple[int, int, float, float]:
    """(first seq, last seq, first line's time, last line's time) of a
    follower's ``logs`` frame, without unpacking its lines."""
    first = frame["first_seq"]
    return first, first + len(frame["streams"]) - 1, frame["times"][0][1], frame["times"][-1][1]
