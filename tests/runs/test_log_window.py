"""Windows of a job's log and search in it (``GET …/jobs/<job>/logs/`` with
``before_seq``, ``tail`` and ``search``; docs/LOGS.md, "Windows and
search"): what the dashboard's viewer reads a long log with."""

from __future__ import annotations

from typing import Any

import pytest

from backend.accounts.models import Workspace
from backend.runs.models import Job, Run
from tests.support.fixtures import Person, submit
from tests.support.logfill import fill_job_log
from tests.support.testdb import django_test_db_url

pytestmark = pytest.mark.django_db(transaction=True)

BASE = "/api/v1/workspaces/acme"
# Line seq n (from 1) is "\x1b[1mstep\x1b[0m <n-1> loss": bold, as a progress printer colours it.
STEP = "\x1b[1mstep\x1b[0m {:d} loss"


def _fill(job: Job, lines: int, text: str = STEP) -> None:
    """The lines through the sanctioned filler, into the test database."""
    fill_job_log(django_test_db_url(), str(job.pk), lines, text)


def _logs(person: Person, job: Job, workspace: str = "acme", **params: Any) -> Any:
    return person.client().get(f"/api/v1/workspaces/{workspace}/jobs/{job.pk}/logs/", params)


@pytest.fixture
def job(run: Run) -> Job:
    found = run.jobs.get()
    _fill(found, 100)
    return found


def _seqs(response: Any) -> list[int]:
    return [line["seq"] for line in response.json()["lines"]]


def test_tail_gives_the_last_lines_in_seq_order_and_the_last_seq(job: Job, member: Person) -> None:
    response = _logs(member, job, tail=3)

    assert response.status_code == 200
    body = response.json()
    assert [line["text"] for line in body["lines"]] == [STEP.format(97), STEP.format(98), STEP.format(99)]
    assert _seqs(response) == [98, 99, 100]
    assert (body["has_more"], body["last_seq"]) == (True, 100)


def test_a_tail_longer_than_the_log_gives_all_of_it_with_nothing_more(job: Job, member: Person) -> None:
    response = _logs(member, job, tail=500)

    assert _seqs(response) == list(range(1, 101))
    assert response.json()["has_more"] is False
    assert _logs(member, job, tail=0).json()["lines"] == []


def test_before_seq_gives_the_lines_just_before_it(job: Job, member: Person) -> None:
    window = _logs(member, job, before_seq=50, limit=5)
    start = _logs(member, job, before_seq=4, limit=5)

    assert (_seqs(window), window.json()["has_more"]) == ([45, 46, 47, 48, 49], True)
    assert (_seqs(start), start.json()["has_more"]) == ([1, 2, 3], False)
    assert _seqs(_logs(member, job, before_seq=1)) == []


def test_before_seq_keeps_the_lines_next_to_it_when_they_do_not_all_fit(
    job: Job, member: Person, settings: Any
) -> None:
    settings.TRAINYARD = {**settings.TRAINYARD, "LOG_PAGE_BYTES": 100}

    response = _logs(member, job, before_seq=61, limit=20)

    assert _seqs(response)[-1] == 60
    assert 1 <= len(_seqs(response)) < 20 and response.json()["has_more"] is True


def test_after_seq_pages_as_before_and_now_says_the_last_seq(job: Job, member: Person) -> None:
    response = _logs(member, job, after_seq=98)

    assert (_seqs(response), response.json()["has_more"], response.json()["last_seq"]) == ([99, 100], False, 100)


def test_search_finds_the_nearest_match_either_way_ignoring_case_and_colour(job: Job, member: Person) -> None:
    def found(**params: Any) -> int | None:
        response = _logs(member, job, **params)
        assert response.status_code == 200, response.content
        assert response.json()["last_seq"] == 100
        return response.json()["seq"]  # type: ignore[no-any-return]

    assert found(search="STEP 5 loss") == 6
    assert found(search="5 loss", from_seq=7) == 16
    assert found(search="5 loss", from_seq=16) == 16
    assert found(search="5 loss", direction="prev") == 96
    assert found(search="5 loss", direction="prev", from_seq=95) == 86
    assert found(search="step 98 loss", from_seq=100) is None
    assert found(search="step 0 loss", direction="prev", from_seq=1) == 1
    assert found(search="no such text") is None


def test_search_reads_across_batches_of_a_long_log(run: Run, member: Person) -> None:
    job = run.jobs.get()
    _fill(job, 120_000, "line {:09d}")

    assert _logs(member, job, search="line 000119998").json()["seq"] == 119_999
    assert _logs(member, job, search="line 000000002", direction="prev").json()["seq"] == 3


def test_a_search_stops_at_its_byte_budget_says_partial_and_goes_on_from_where_it_stopped(
    run: Run, member: Person, settings: Any
) -> None:
    """A search reads at most TRAINYARD_LOG_SEARCH_BYTES (and the batch that
    takes it there) per request: past it, no match yet, ``partial`` and the
    seq it read to; asked again from just past that seq it goes on, either
    way, until it finds the line."""
    job = run.jobs.get()
    _fill(job, 120_000, "line {:09d}")  # 15 bytes a line: 1.8 MB
    budget = 200_000
    settings.TRAINYARD = {**settings.TRAINYARD, "LOG_SEARCH_BYTES": budget}

    first = _logs(member, job, search="line 000119998").json()
    assert (first["seq"], first["partial"]) == (None, True)
    assert 1 < first["searched_to"] < 119_999
    answers, at = [], first
    while at["partial"]:
        at = _logs(member, job, search="line 000119998", from_seq=at["searched_to"] + 1).json()
        answers.append(at)
    assert (at["seq"], at["searched_to"]) == (119_999, None)
    # Each answer read about the budget: the log took several of them, none stalled.
    assert 5 <= len(answers) + 1 <= 20
    assert all(b["searched_to"] > a["searched_to"] for a, b in zip([first, *answers[:-2]], answers[:-1], strict=True))

    back = _logs(member, job, search="line 000000002", direction="prev").json()
    assert (back["seq"], back["partial"]) == (None, True) and 3 < back["searched_to"] < 120_000
    while back["partial"]:
        back = _logs(member, job, search="line 000000002", direction="prev", from_seq=back["searched_to"] - 1).json()
    assert back["seq"] == 3

    whole = _logs(member, job, search="no such line").json()
    assert whole["partial"] is True


def test_a_search_within_its_budget_is_not_partial(job: Job, member: Person) -> None:
    answer = _logs(member, job, search="no such text").json()

    assert (answer["seq"], answer["partial"], answer["searched_to"]) == (None, False, None)


def test_log_searches_are_rate_limited_per_user_with_retry_after_and_pages_are_not(
    job: Job, member: Person, settings: Any
) -> None:
    limits = {**settings.TRAINYARD["RATE_LIMITS"], "logsearch": {"user": (3, 60), "ip": None}}
    settings.TRAINYARD = {**settings.TRAINYARD, "RATE_LIMITS": limits}

    statuses = [_logs(member, job, search="loss").status_code for _ in range(4)]
    refused = _logs(member, job, search="loss")

    assert statuses == [200, 200, 200, 429]
    assert int(refused["Retry-After"]) >= 1
    assert refused.json()["message"].startswith("Too many log searches from this account: at most 3 per minute.")
    assert _logs(member, job, tail=5).status_code == 200


def test_seqs_past_any_line_read_as_the_end_of_the_log(job: Job, member: Person) -> None:
    huge = str(10**30)

    assert _seqs(_logs(member, job, before_seq=huge, limit=2)) == [99, 100]
    assert _seqs(_logs(member, job, after_seq=huge)) == []
    assert _logs(member, job, search="step 1 loss", direction="prev", from_seq=huge).json()["seq"] == 2
    assert _logs(member, job, search="step 1 loss", from_seq=huge).json()["seq"] is None


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"tail": 5, "before_seq": 9}, "Give one of after_seq, before_seq and tail, not before_seq and tail."),
        (
            {"after_seq": 1, "before_seq": 9},
            "Give one of after_seq, before_seq and tail, not after_seq and before_seq.",
        ),
        ({"before_seq": 0}, "before_seq must be at least 1."),
        ({"tail": "x"}, "tail must be a whole number, not 'x'."),
        ({"search": " "}, "search must not be empty."),
        ({"search": "a", "direction": "up"}, "direction must be next or prev, not 'up'."),
        ({"search": "a", "from_seq": 0}, "from_seq must be at least 1."),
    ],
)
def test_bad_parameters_are_a_400_that_says_why(job: Job, member: Person, params: dict[str, Any], message: str) -> None:
    response = _logs(member, job, **params)

    assert response.status_code == 400
    assert response.json()["message"] == message


def test_a_job_of_another_workspace_is_a_404_for_windows_and_search(team: Workspace, owner: Person) -> None:
    other = Workspace.objects.create(slug="other", name="Other")
    elsewhere = submit(other, owner.user).jobs.get()
    _fill(elsewhere, 10)

    assert _logs(owner, elsewhere, tail=5).status_code == 404
    assert _logs(owner, elsewhere, search="loss").status_code == 404
    assert _logs(owner, elsewhere, workspace="other", tail=5).status_code in (403, 404)


def test_viewers_read_windows_and_outsiders_do_not(job: Job, viewer: Person, outsider: Person) -> None:
    assert _logs(viewer, job, tail=1).status_code == 200
    assert _logs(outsider, job, tail=1).status_code == 404
    assert _logs(outsider, job, search="loss").status_code == 404


def test_a_match_in_a_batch_with_a_gap_gets_the_seq_of_its_line(job: Job, monkeypatch: pytest.MonkeyPatch) -> None:
    """Lines past a log cap are not stored: a batch may cover seqs 1..7 with
    three lines. The hit's seq comes from the pages, not from counting."""
    from backend.runs.selectors import LogPage
    from backend.runs.services import logwindow
    from backend.runs.services.rawlog import RawBatch

    class GappedReader:
        def batches(self, *, after: int, until: int, timestamps: bool, rows: int) -> Any:
            yield RawBatch(1, 7, b"alpha\nbeta\nthe \x1b[1mNeedle\x1b[0m\n")

    pages: list[tuple[int, int]] = []

    def page(*, job: Job, after_seq: int, limit: int, max_bytes: int, until: int | None = None) -> LogPage:
        pages.append((after_seq, limit))
        lines = [(seq, 0.0, "o", "") for seq in (1, 2, 7) if seq > after_seq][:limit]
        return LogPage(lines, False)

    monkeypatch.setattr(logwindow, "log_reader_for", lambda job: GappedReader())
    monkeypatch.setattr(logwindow, "job_log_page", page)

    found = logwindow.log_search(
        job=job, text="the needle", from_seq=1, direction="next", max_bytes=1 << 20, budget_bytes=1 << 20
    )

    assert (found, pages) == (logwindow.LogSearch(7), [(0, 3)])
