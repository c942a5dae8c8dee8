"""How the CLI shows attempts: `trainyard logs` marks, `trainyard show` rows."""

from __future__ import annotations

from typing import Any

from trainyard.output import AttemptMarks, attempt_rows


def _job(*attempts: dict[str, Any]) -> dict[str, Any]:
    return {"name": "train", "attempts": list(attempts)}


LOST = {"number": 1, "instance": "local-a", "reason": "instance_lost", "message": "machine local-a is gone",
        "first_seq": 1, "last_seq": 2, "started_at": None, "finished_at": None}  # fmt: skip
DONE = {"number": 2, "instance": "local-b", "reason": "done", "message": "", "first_seq": 3, "last_seq": 3,
        "started_at": None, "finished_at": None}  # fmt: skip


def test_logs_mark_each_attempt_in_the_one_log() -> None:
    marks = AttemptMarks(_job(LOST, DONE))
    lines = [(1, "o", "a"), (2, "o", "b"), (3, "o", "c")]
    printed = [text for _, text in [*marks.around(lines), *marks.rest()]]
    assert printed == [
        "--- attempt 1 of train on local-a ---",
        "a",
        "b",
        "--- attempt 1 ended: instance_lost (machine local-a is gone) ---",
        "--- attempt 2 of train on local-b ---",
        "c",
    ]


def test_a_job_that_ran_once_gets_no_marks() -> None:
    marks = AttemptMarks(_job(DONE | {"number": 1, "first_seq": 1}))
    assert [t for _, t in [*marks.around([(1, "o", "x")]), *marks.rest()]] == ["x"]


def test_an_attempt_without_lines_still_shows_and_a_last_failure_is_marked() -> None:
    no_capacity = {"number": 2, "instance": None, "reason": "no_capacity", "message": "tried 3 of 3 offers",
                   "first_seq": 3, "last_seq": 2}  # fmt: skip
    marks = AttemptMarks(_job(LOST, no_capacity))
    printed = [t for _, t in [*marks.around([(1, "o", "a"), (2, "o", "b")]), *marks.rest()]]
    assert printed[-3:] == [
        "--- attempt 1 ended: instance_lost (machine local-a is gone) ---",
        "--- attempt 2 of train on - ---",
        "--- attempt 2 ended: no_capacity (tried 3 of 3 offers) ---",
    ]


def test_show_lists_attempts_only_for_jobs_that_had_more_than_an_ordinary_one() -> None:
    run = {"jobs": [_job(LOST, DONE), {"name": "plain", "attempts": [DONE | {"number": 1}]}]}
    rows = attempt_rows(run)
    assert [(r[0], r[1], r[2], r[3], r[6]) for r in rows] == [
        ("train", "1", "local-a", "-", "instance_lost: machine local-a is gone"),
        ("train", "2", "local-b", "-", "done"),
    ]


def test_a_resumed_attempt_says_which_checkpoint_it_started_from() -> None:
    resumed = DONE | {"restored_checkpoint": 4}
    marks = AttemptMarks(_job(LOST, resumed))
    printed = [text for _, text in [*marks.around([(1, "o", "a"), (3, "o", "c")]), *marks.rest()]]
    rows = attempt_rows({"jobs": [_job(LOST, resumed)]})

    assert "--- attempt 2 of train on local-b · resumed from checkpoint 4 ---" in printed
    assert rows[1][6] == "done (resumed from checkpoint 4)"


def test_a_cloud_attempt_says_its_machine_zone_and_market() -> None:
    interrupted = LOST | {"instance": "aws-1", "backend": "aws", "instance_type": "g5.xlarge", "region": "us-east-1",
                          "zone": "us-east-1a", "spot": True, "reason": "interrupted", "message": "spot notice"}  # fmt: skip
    resumed = DONE | {"instance": "aws-2", "backend": "aws", "instance_type": "g5.xlarge", "region": "us-east-1",
                      "zone": "us-east-1b", "spot": False, "restored_checkpoint": 4}  # fmt: skip
    marks = AttemptMarks(_job(interrupted, resumed))
    printed = [text for _, text in [*marks.around([(1, "o", "a"), (3, "o", "c")]), *marks.rest()]]
    rows = attempt_rows({"jobs": [_job(interrupted, resumed)]})

    assert printed[0] == "--- attempt 1 of train on aws-1 · g5.xlarge us-east-1a (spot) ---"
    assert (
        "--- attempt 2 of train on aws-2 · resumed from checkpoint 4 · g5.xlarge us-east-1b (on-demand) ---" in printed
    )
    assert [r[3] for r in rows] == ["g5.xlarge us-east-1a (spot)", "g5.xlarge us-east-1b (on-demand)"]
