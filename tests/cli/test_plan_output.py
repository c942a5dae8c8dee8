"""``trainyard run --dry-run``'s environment line, from the server's
``PlannedEnvironmentOut`` (docs/ENVIRONMENTS.md, "Before a job runs")."""

from __future__ import annotations

from trainyard.output import environment_words, plan_lines


def _outlook(**changes: object) -> dict[str, object]:
    return {"state": "to build", "key": "", "built_on": "", "stored": False, "build_seconds": None, **changes}


def test_each_state_in_words() -> None:
    assert environment_words(_outlook()) == "to be built (never built before)"
    assert (
        environment_words(_outlook(build_seconds=21.04)) == "to be built (the last build of this workflow took 21.0 s)"
    )
    ready = _outlook(state="ready", key="a" * 24, built_on="local-2", build_seconds=2.25)
    assert environment_words(ready) == f"ready ({'a' * 24}, built on local-2 in 2.2 s; other machines build it)"
    assert environment_words({**ready, "stored": True}).endswith("; stored, so other machines restore it)")
    assert environment_words(_outlook(state="unknown")) == "unknown (the requirements' digests were not sent)"


def test_the_plan_shows_it_for_a_job_that_runs_not_for_a_cached_one_or_one_without() -> None:
    job = {"name": "train", "provider": "bash", "resources": {}, "commands": ["python train.py"]}
    plan = {
        "workflow": "train",
        "jobs": [
            {**job, "environment": _outlook()},
            {**job, "name": "cached", "environment": _outlook(), "cache": {"run": "brave-otter-3", "job": "x"}},
            {**job, "name": "bare", "environment": None},
        ],
    }
    lines = plan_lines(plan)
    assert [line for line in lines if "environment:" in line] == ["   environment: to be built (never built before)"]


def test_the_plan_and_show_name_a_jobs_guards() -> None:
    from trainyard.output import guard_lines

    guards = ["stall: restarted from its last checkpoint after 20m without output"]
    job = {"name": "train", "provider": "bash", "resources": {}, "commands": ["python train.py"], "guards": guards}
    assert "   guard: stall: restarted from its last checkpoint after 20m without output" in plan_lines(
        {"workflow": "train", "jobs": [job]}
    )
    placement = {
        "utilization_policy": {"min_gpu_utilization": 10, "time_window": 1800},
        "stall": {"timeout": 1200, "action": "stop"},
    }
    assert guard_lines({"jobs": [{"name": "train", "placement": placement}, {"name": "eval", "placement": {}}]}) == [
        "  train: utilization_policy: stopped when every GPU stays below 10% for 30m",
        "  train: stall: stopped after 20m without output",
    ]
