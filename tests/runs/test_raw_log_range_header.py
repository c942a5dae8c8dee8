"""A client's ``Range`` header is read in time linear in its length
(backend/runs/services/rawlog.py ``_RANGE``): a long header of spaces and
digits, which made the pattern try every split of its spaces, is answered at
once, and the headers a download sends still parse as before."""

from __future__ import annotations

import time

import pytest

from backend.runs.services.rawlog import _RANGE


@pytest.mark.parametrize(
    ("header", "groups"),
    [("bytes=0-99", ("0", "99")), ("bytes=-7", ("", "7")), (" Bytes = 5 - ", ("5", "")), ("bytes=1-2,3-4", None)],
)
def test_the_headers_a_download_sends_parse(header: str, groups: tuple[str, str] | None) -> None:
    found = _RANGE.fullmatch(header)
    assert (found.groups() if found else None) == groups


@pytest.mark.parametrize(
    "header", ["bytes=1-" + " " * 16_384 + "x", "bytes=" + " " * 16_384 + "-x", " " * 65_536 + "x"]
)
def test_a_long_header_of_spaces_is_refused_in_one_pass(header: str) -> None:
    started = time.thread_time()
    assert _RANGE.fullmatch(header) is None
    assert time.thread_time() - started < 0.05, "the pattern backtracks over the header's spaces"
