"""The runs list and the run page at scale: keyset pages by an opaque cursor,
a count that is exact while cheap and says when it is estimated, and a
constant number of queries however many runs, jobs and tags a page holds."""

from __future__ import annotations

import hashlib
import json
from typing import Any

import pytest
from django.db import connection
from rest_framework.utils.encoders import JSONEncoder

from backend.accounts.models import Workspace
from backend.artifacts.models import Artifact, ArtifactFile, ArtifactStatus
from backend.clouds.models import Instance
from backend.runs.api.serializers import AttemptOut
from backend.runs.models import Attempt, Run
from backend.runs.scheduler.passes import jobs_schedule
from backend.runs.services.runs import run_rerun
from backend.runs.services.tags import tag_set
from tests.support.attempts import accept, report
from tests.support.fixtures import WORKFLOWS, Person, submit

BASE = "/api/v1/workspaces/acme"
# Token + user (and its once-a-minute last_used_at write: a new token's
# first request), membership + workspace, and the page: runs, tags, jobs with
# their DAG edges, attempts, inputs and checkpoints, and the count up to the
# threshold, in one query (docs/decisions/0057-runs-list-page-in-sql.md).
RUNS_LIST_QUERIES = 4
SEARCH_QUERIES = 1  # the submitters a search names, looked up first
ESTIMATE_QUERIES = 1  # above RUNS_EXACT_COUNT_UP_TO, the planner's estimate
# The run page: the run, then its jobs (with_shown), their inputs, the rest of RunOut.
RUN_PAGE_QUERIES = 8
# A re-run adds its original, both runs' jobs, their artifacts' digests and
# the files of the artifacts that differ (backend/runs/services/reproduced.py).
RERUN_QUERIES = 4


def _train_runs(team: Workspace, person: Person, count: int) -> list[Run]:
    """Runs of two jobs each (train needs hello: inputs and a DAG edge), each tagged."""
    runs = [submit(team, person.user, workflow="train") for _ in range(count)]
    for number, run in enumerate(runs):
        Run.objects.filter(pk=run.pk).update(status="succeeded")
        run.status = "succeeded"
        tag_set(workspace=team, user=person.user, name=f"t{number}", run=run, force=False)
    return runs


@pytest.mark.parametrize("count", [3, 40])
def test_the_runs_list_runs_the_same_few_queries_for_3_and_for_40_runs(
    team: Workspace, owner: Person, count: int, django_assert_max_num_queries: Any
) -> None:
    _train_runs(team, owner, count)
    client = owner.client()

    with django_assert_max_num_queries(RUNS_LIST_QUERIES):
        body = client.get(f"{BASE}/runs/?page_size=50").json()

    assert body["count"] == count
    assert body["count_estimated"] is False
    assert len(body["results"]) == count
    first = body["results"][0]
    assert [j["name"] for j in first["jobs"]] == ["hello", "train"]
    assert first["jobs"][1]["needs"] == ["hello"]
    assert first["tags"] == [f"t{count - 1}"]


@pytest.mark.parametrize("query", ["", "status=succeeded", "workflow=train", "q=olivia", "tag=t1"])
def test_every_filter_of_the_runs_list_keeps_the_bound(
    team: Workspace, owner: Person, query: str, django_assert_max_num_queries: Any
) -> None:
    _train_runs(team, owner, 12)

    with django_assert_max_num_queries(RUNS_LIST_QUERIES + (SEARCH_QUERIES if query.startswith("q=") else 0)):
        body = owner.client().get(f"{BASE}/runs/?{query}").json()

    assert len(body["results"]) == (1 if query == "tag=t1" else 12)


@pytest.mark.parametrize("jobs", [3, 100])
def test_the_run_page_of_a_run_with_100_jobs_is_served_in_a_constant_number_of_queries(
    team: Workspace, owner: Person, jobs: int, django_assert_max_num_queries: Any
) -> None:
    run = submit(team, owner.user, workflow="all", text=_wide_workflows(jobs - 1))

    with django_assert_max_num_queries(RUN_PAGE_QUERIES):
        body = owner.client().get(f"{BASE}/runs/{run.name}/").json()

    assert len(body["jobs"]) == jobs
    last = next(j for j in body["jobs"] if j["name"] == "all")
    assert len(last["needs"]) == jobs - 1


@pytest.mark.parametrize("jobs", [3, 100])
def test_a_reruns_artifacts_are_compared_in_a_constant_number_of_queries(
    team: Workspace, owner: Person, jobs: int, django_assert_max_num_queries: Any
) -> None:
    first = submit(team, owner.user, workflow="all", text=_wide_workflows(jobs - 1))
    again = run_rerun(run=first, user=owner.user)
    _succeeded_with_outputs(first, b"one")
    _succeeded_with_outputs(again, b"two")
    client = owner.client()

    with django_assert_max_num_queries(RUN_PAGE_QUERIES + RERUN_QUERIES):
        body = client.get(f"{BASE}/runs/{again.name}/").json()
    with django_assert_max_num_queries(RUNS_LIST_QUERIES + RERUN_QUERIES):
        listed = client.get(f"{BASE}/runs/").json()["results"]

    assert (body["rerun_of"], body["reproduced"]["state"]) == (first.name, "differs")
    # Every job but ``all`` (which writes nothing) wrote ./out with another w.bin.
    assert [d["text"] for d in body["reproduced"]["differences"]] == sorted(
        f"w{n} ./out (w.bin)" for n in range(jobs - 1)
    )
    assert [(r["name"], r["reproduced"]) for r in listed] == [(again.name, body["reproduced"]), (first.name, None)]


@pytest.mark.parametrize("case", ["first page", "a later page", "filter", "search"])
def test_a_page_of_a_workspace_above_the_count_threshold_takes_at_most_five_queries(
    team: Workspace, owner: Person, settings: Any, case: str, django_assert_max_num_queries: Any
) -> None:
    """The bench's four cases (bench/runs_list.py), each the token's first
    request but the later page's: its count is the estimate, or exact for a
    search of a few runs."""
    runs = _train_runs(team, owner, 30)
    Run.objects.filter(pk__in=[r.pk for r in runs[::10]]).update(status="failed")
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE runs_run")
    settings.TRAINYARD = {**settings.TRAINYARD, "RUNS_EXACT_COUNT_UP_TO": 2}
    client = owner.client()
    query = {
        "first page": "",
        "a later page": client.get(f"{BASE}/runs/?page_size=10").json()["next"].partition("?")[2],
        "filter": "status=failed",
        "search": f"q={runs[7].name}",
    }[case]

    with django_assert_max_num_queries(RUNS_LIST_QUERIES + ESTIMATE_QUERIES):
        body = client.get(f"{BASE}/runs/?page_size=10&{query}").json()

    if case == "search":  # its name (perhaps another's contains it too)
        assert runs[7].name in [r["name"] for r in body["results"]]
    shown = {"first page": 10, "a later page": 10, "filter": 3, "search": len(body["results"])}[case]
    estimated = case in ("first page", "a later page")
    assert (len(body["results"]), body["count"], body["count_estimated"]) == (
        shown,
        30 if estimated else shown,
        estimated,
    )


def test_pages_follow_the_cursor_through_every_run_once_newest_first(team: Workspace, owner: Person) -> None:
    made = [submit(team, owner.user).name for _ in range(7)]
    client = owner.client()

    seen, url, pages = [], f"{BASE}/runs/?page_size=3", 0
    while url:
        body = client.get(url).json()
        seen += [r["name"] for r in body["results"]]
        url, pages = body["next"], pages + 1
        assert body["count"] == 7

    assert seen == list(reversed(made))
    assert pages == 3


def test_the_next_link_keeps_the_filters_and_the_page_size(team: Workspace, owner: Person, member: Person) -> None:
    mine = [submit(team, owner.user, workflow="big").name for _ in range(3)]
    submit(team, member.user, workflow="big")
    submit(team, owner.user)
    client = owner.client()

    first = client.get(f"{BASE}/runs/?workflow=big&q=olivia&page_size=2").json()
    second = client.get(first["next"]).json()

    assert [r["name"] for r in first["results"] + second["results"]] == list(reversed(mine))
    assert "workflow=big" in first["next"] and "page_size=2" in first["next"]
    assert second["next"] is None


def test_runs_created_after_the_first_page_do_not_shift_the_next_page(team: Workspace, owner: Person) -> None:
    old = [submit(team, owner.user).name for _ in range(4)]
    client = owner.client()
    first = client.get(f"{BASE}/runs/?page_size=2").json()

    submit(team, owner.user)
    second = client.get(first["next"]).json()

    assert [r["name"] for r in second["results"]] == list(reversed(old))[2:]


def test_the_count_is_estimated_above_the_threshold_and_says_so(team: Workspace, owner: Person, settings: Any) -> None:
    for _ in range(5):
        submit(team, owner.user)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE runs_run")
    settings.TRAINYARD = {**settings.TRAINYARD, "RUNS_EXACT_COUNT_UP_TO": 2}

    body = owner.client().get(f"{BASE}/runs/?page_size=2").json()
    whole = owner.client().get(f"{BASE}/runs/").json()

    assert body["count_estimated"] is True
    assert body["count"] >= 3
    assert len(body["results"]) == 2
    # A first page that holds every match counts them itself: exact at any threshold.
    assert (whole["count"], whole["count_estimated"], len(whole["results"])) == (5, False, 5)


def test_a_cursor_that_is_not_one_is_refused_with_a_clear_error(team: Workspace, owner: Person) -> None:
    response = owner.client().get(f"{BASE}/runs/?cursor=not-a-cursor")

    assert response.status_code == 400
    assert response.json()["message"] == (
        "cursor is not valid: pass the `next` link (or its cursor) of the previous page unchanged."
    )


def test_a_cursor_never_shows_another_workspaces_runs(team: Workspace, owner: Person) -> None:
    other = Workspace.objects.create(slug="other", name="Other")
    for _ in range(3):
        submit(other, owner.user)
    mine = [submit(team, owner.user).name for _ in range(3)]
    client = owner.client()

    first = client.get(f"{BASE}/runs/?page_size=1").json()
    rest = client.get(first["next"].replace("page_size=1", "page_size=50")).json()

    assert [r["name"] for r in first["results"] + rest["results"]] == list(reversed(mine))
    assert rest["count"] == 3


def test_the_search_reads_the_trigram_index_where_postgres_has_pg_trgm_and_needs_none_elsewhere(
    team: Workspace, owner: Person
) -> None:
    """Where Postgres has pg_trgm (production's images), the migration made
    the trigram indexes and a search reads them. Where it has none (the
    embedded Postgres of ``make test``), the migration made none and did not
    fail: a search reads the workspace's runs newest first until a page
    matches (bench/results/2026-12-02-runs-list.md). The suite checks the branch of the
    Postgres it runs on; ``DATABASE_URL=<a Postgres with pg_trgm> make test``
    checks the other."""
    run = submit(team, owner.user)
    with connection.cursor() as cursor:
        cursor.execute("SELECT 1 FROM pg_available_extensions WHERE name = 'pg_trgm'")
        has_trgm = cursor.fetchone() is not None
        cursor.execute("SELECT indexname FROM pg_indexes WHERE indexname IN ('run_name_trgm', 'run_workflow_trgm')")
        made = {row[0] for row in cursor.fetchall()}
        cursor.execute("SET LOCAL enable_seqscan = off")
        cursor.execute("EXPLAIN SELECT id FROM runs_run WHERE UPPER(name::text) LIKE UPPER('%otter%')")
        plan = "\n".join(row[0] for row in cursor.fetchall())

    if has_trgm:
        assert made == {"run_name_trgm", "run_workflow_trgm"}
        assert "run_name_trgm" in plan
    else:
        assert made == set()
    assert owner.client().get(f"{BASE}/runs/?q=zzz-nowhere").json()["results"] == []
    found = owner.client().get(f"{BASE}/runs/?q={run.name[2:-1].upper()}").json()["results"]
    assert [r["name"] for r in found] == [run.name]


def test_attempts_read_with_the_page_show_exactly_what_the_attempts_rows_hold(team: Workspace, owner: Person) -> None:
    """Attempts come as an array column of the jobs' query; what the list and
    the run page show of them is what AttemptOut shows of the rows."""
    run = submit(team, owner.user)
    first = Instance.objects.create(
        workspace=team, backend="local", name="box-1", token_hash="a" * 64, status="idle",
        cpus=8, memory_bytes=2**34, channel_name="c", hostname="box",
    )  # fmt: skip
    jobs_schedule()
    job = run.jobs.get()
    accept(job, first.pk)
    report(job, first.pk, "failed", exit_code=3, reason="exit 3")
    rows = Attempt.objects.filter(job=job).select_related("instance").order_by("number")
    expected = json.loads(json.dumps(AttemptOut(rows, many=True).data, cls=JSONEncoder))
    client = owner.client()

    listed = client.get(f"{BASE}/runs/").json()["results"][0]["jobs"][0]["attempts"]
    shown = client.get(f"{BASE}/runs/{run.name}/").json()["jobs"][0]["attempts"]

    assert expected and expected[0]["instance"] == "box-1" and expected[0]["started_at"]
    assert listed == shown == expected


def _succeeded_with_outputs(run: Run, data: bytes) -> None:
    """The run and its jobs succeeded; each job with ``artifacts`` wrote its
    first one, one file ``w.bin`` holding ``data``."""
    Run.objects.filter(pk=run.pk).update(status="succeeded")
    run.jobs.update(status="succeeded")
    artifacts = Artifact.objects.bulk_create(
        Artifact(
            workspace=run.workspace,
            run=run,
            job=job,
            path=job.spec["artifacts"][0],
            status=ArtifactStatus.COMPLETE,
            storage_prefix=f"workspaces/{run.workspace_id}/artifacts/{job.pk}",
        )
        for job in run.jobs.all()
        if job.spec.get("artifacts")
    )
    sha = hashlib.sha256(data).hexdigest()
    ArtifactFile.objects.bulk_create(
        ArtifactFile(artifact=a, path="w.bin", size=len(data), sha256=sha) for a in artifacts
    )


def _wide_workflows(deps: int) -> str:
    """``all`` needs ``deps`` workflows: a run of ``deps + 1`` jobs."""
    lines = [WORKFLOWS.rstrip("\n")]
    for n in range(deps):
        lines += [f"  - name: w{n}", "    provider: bash", "    commands: [echo hi]", "    artifacts: [./out]"]
    lines += ["  - name: all", "    provider: bash", "    commands: [ls]", "    deps:"]
    lines += [f"      - workflow: w{n}" for n in range(deps)]
    return "\n".join(lines) + "\n"
