from __future__ import annotations

import io
import time

import httpx
import pytest
from trainyard.api import ApiError
from trainyard.commands.submission import run_exit_code
from trainyard.follow import Follower
from trainyard.output import LogWriter

from tests.cli.fakes import FakeRunSocket, lines_of, make_job, make_run, rest_client, serving


def no_rest(request: httpx.Request) -> httpx.Response:
    raise AssertionError(f"unexpected REST call {request.url}")


def follow(url: str, *, seen: dict[str, int] | None = None) -> tuple[dict, str, str, list[str]]:
    out, err, statuses = io.StringIO(), io.StringIO(), []
    follower = Follower(
        rest_client(url, no_rest),
        "brave-otter-1",
        writer=LogWriter(out, err),
        on_run=lambda r: statuses.append(r["status"]),
        seen=seen,
    )
    final = follower.follow()
    return final, out.getvalue(), err.getvalue(), statuses


def test_every_line_is_printed_once_across_dropped_connections(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr("trainyard.follow.time.sleep", lambda s: None)
    socket = FakeRunSocket(lines_of(300), final=make_run("succeeded", last_seq=300), drops=2, drop_after=100)
    with serving(socket) as url:
        final, out, _, statuses = follow(url)
    assert out == "".join(f"line {i}\n" for i in range(1, 301))
    assert socket.after_seqs == [0, 100, 200]
    assert final["status"] == "succeeded" and statuses[-1] == "succeeded"


def test_lines_already_seen_are_not_printed_again():
    socket = FakeRunSocket(lines_of(10), final=make_run("succeeded", last_seq=10))
    with serving(socket) as url:
        _, out, _, _ = follow(url, seen={"job-1": 7})
    assert out == "line 8\nline 9\nline 10\n"
    assert socket.after_seqs == [7]


def test_stderr_lines_go_to_stderr_and_a_failed_run_gives_its_exit_code():
    lines = [[1, 1.0, "o", "about to"], [2, 1.0, "e", "about to fail"]]
    socket = FakeRunSocket(lines, final=make_run("failed", last_seq=2, exit_code=3, reason="exit code 3"))
    with serving(socket) as url:
        final, out, err, _ = follow(url)
    assert (out, err) == ("about to\n", "about to fail\n")
    assert run_exit_code(final) == 3


@pytest.mark.parametrize(
    ("code", "message"),
    [
        (
            4401,
            "the server refused the websocket: no valid credentials (check TRAINYARD_TOKEN, or run `trainyard login`)",
        ),
        (4404, "run brave-otter-1: no such run in this workspace"),
    ],
)
def test_refused_websocket_is_an_error_not_a_retry(code: int, message: str):
    socket = FakeRunSocket([], final=make_run("succeeded"), close_code=code)
    with serving(socket) as url, pytest.raises(ApiError) as info:
        follow(url)
    assert info.value.message == message


def test_a_socket_refused_over_a_limit_says_so_once_and_is_retried(monkeypatch: pytest.MonkeyPatch):
    """4429 is "retry later": the server names the limit (connects per minute,
    open sockets per user); the follower says it once on stderr and retries."""
    monkeypatch.setattr("trainyard.follow.time.sleep", lambda s: None)
    reason = "too many open websockets: at most 50 per user (TRAINYARD_WS_PER_USER); close one and retry"
    socket = FakeRunSocket(lines_of(3), final=make_run("succeeded", last_seq=3), refusals=[(4429, reason)] * 2)
    with serving(socket) as url:
        final, out, err, _ = follow(url)
    assert (final["status"], out) == ("succeeded", "line 1\nline 2\nline 3\n")
    assert err == f"trainyard: the server refused the websocket ({reason}); retrying\n"


def test_missing_lines_of_a_finished_run_are_fetched_over_rest(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr("trainyard.follow.CATCH_UP_AFTER", 0.0)

    def rest(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/api/v1/workspaces/ws1/jobs/job-1/logs/"
        assert request.url.params["after_seq"] == "2"
        return httpx.Response(
            200,
            json={"job": "job-1", "lines": [{"seq": 3, "ts": 1.0, "stream": "o", "text": "line 3"}], "has_more": False},
        )

    socket = FakeRunSocket(lines_of(2), final=make_run("succeeded", last_seq=3))
    with serving(socket) as url:
        out = io.StringIO()
        Follower(
            rest_client(url, rest), "brave-otter-1", writer=LogWriter(out, io.StringIO()), on_run=lambda r: None
        ).follow()
    assert out.getvalue() == "line 1\nline 2\nline 3\n"


def test_follower_keeps_up_with_100k_lines():
    socket = FakeRunSocket(lines_of(100_000), final=make_run("succeeded", last_seq=100_000))
    with serving(socket) as url:
        started = time.monotonic()
        _, out, _, _ = follow(url)
        elapsed = time.monotonic() - started
    assert out.count("\n") == 100_000
    assert elapsed < 5.0, f"100,000 lines took {elapsed:.2f}s"


def test_run_exit_codes():
    assert run_exit_code(make_run("succeeded")) == 0
    assert run_exit_code(make_run("failed", exit_code=3)) == 3
    assert run_exit_code(make_run("failed")) == 1
    assert run_exit_code(make_run("stopped")) == 1


def test_a_run_of_several_jobs_prefixes_each_line_with_its_job_and_exits_with_the_first_failure():
    jobs = [
        make_job("succeeded", id="j1", name="download", last_seq=1, finished_at="2026-01-01T00:00:01Z"),
        make_job("failed", id="j2", name="train-worker-1", last_seq=2, exit_code=4, finished_at="2026-01-01T00:00:09Z"),
        make_job("failed", id="j3", name="train-master", last_seq=1, exit_code=3, finished_at="2026-01-01T00:00:05Z"),
    ]  # fmt: skip
    lines = [
        [1, 1.0, "o", "fetched", "j1"],
        [1, 1.0, "e", "master died", "j3"],
        [1, 1.0, "o", "connecting", "j2"],
        [2, 1.0, "e", "lost master", "j2"],
    ]
    socket = FakeRunSocket(
        [line[:4] for line in lines],
        final=make_run("failed", jobs=jobs),
        job_of=lambda line: next(x[4] for x in lines if x[:4] == line),
    )
    with serving(socket) as url:
        final, out, err, _ = follow(url)
    assert out == "[download] fetched\n[train-worker-1] connecting\n"
    assert err == "[train-master] master died\n[train-worker-1] lost master\n"
    assert run_exit_code(final) == 3
