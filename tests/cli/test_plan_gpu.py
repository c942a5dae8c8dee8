"""The plan names the exact GPU model of the offer chosen (issue 33): the
plan table of ``trainyard run`` and the dry run's offer line show ``1× L4``,
never only the name the workflow asked for."""

from __future__ import annotations

from trainyard.output import PLAN_HEADERS, offer_rows, offer_words, plan_lines

GIB = 2**30
OFFER = {
    "offers": 2,
    "backend": "aws",
    "instance_type": "g6.xlarge",
    "region": "us-east-1",
    "spot": False,
    "price_per_hour": 0.8048,
    "gpus": [{"model": "L4", "count": 1, "memory_bytes": 24 * GIB}],
}


def test_the_plan_table_has_the_gpu_model_of_the_offer() -> None:
    p4d = {**OFFER, "instance_type": "p4d.24xlarge", "gpus": [{"model": "A100-40GB", "count": 8, "memory_bytes": 0}]}
    cpu = {**OFFER, "instance_type": "c7i.large", "gpus": []}
    older = {k: v for k, v in OFFER.items() if k != "gpus"}  # a server from before the plan named GPUs

    rows = offer_rows([{"job": "a", "offer": OFFER}, {"job": "b", "offer": p4d}, {"job": "c", "offer": cpu}])
    rows += offer_rows([{"job": "d", "offer": older}, {"job": "e", "offer": {"offers": 0, "reason": "no L4"}}])

    assert PLAN_HEADERS[4] == "GPU"
    assert [row[4] for row in rows] == ["1× L4", "8× A100-40GB", "-", "-", "-"]
    assert all(len(row) == len(PLAN_HEADERS) for row in rows)


def test_the_dry_run_names_the_gpu_model_of_the_offer() -> None:
    job = {"name": "train", "provider": "bash", "resources": {"gpu_count": 1, "gpu_name": "l4"}, "offer": OFFER}

    lines = plan_lines({"workflow": "train", "jobs": [{**job, "commands": ["python train.py"]}]})

    assert "   offer: aws g6.xlarge (1× L4) in us-east-1, on-demand, $0.8048/h (cheapest of 2)" in lines
    assert offer_words({**OFFER, "gpus": []}) == "aws g6.xlarge in us-east-1, on-demand, $0.8048/h (cheapest of 2)"


def test_the_plan_shows_each_jobs_most_and_the_runs_estimate() -> None:
    rows = offer_rows(
        [{"job": "a", "offer": OFFER, "max_cost": "3.2192"}, {"job": "b", "offer": OFFER, "max_cost": None}]
    )
    assert PLAN_HEADERS[7] == "MAX COST"
    assert [row[7] for row in rows] == ["$3.22", "-"]

    job = {"name": "train", "provider": "bash", "resources": {}, "offer": OFFER, "max_cost": "3.2192"}
    lines = plan_lines({"workflow": "train", "jobs": [job], "estimate": "3.2192"})
    assert lines[1] == "  Estimate: at most $3.22 (each job's cheapest offer × its max_duration)"
    assert "   max cost: $3.22 (its offer's price × max_duration)" in lines
    unbounded = plan_lines({"workflow": "train", "jobs": [{**job, "max_cost": None}], "estimate": None})
    assert unbounded[1].startswith("  Estimate: unbounded (a job has no max_duration or no offer")
    assert "   max cost: unbounded (no max_duration, or no offer)" in unbounded
