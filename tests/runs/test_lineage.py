"""A run's lineage and the New run form's sources, at the service level (real Postgres)."""

from __future__ import annotations

from typing import Any

from backend.accounts.models import Workspace
from backend.runs.models import Job, Run, Tag
from backend.runs.services.lineage import MAX_RUNS, lineage_shown, run_lineage
from backend.runs.services.sources import run_sources
from tests.support.fixtures import WORKFLOWS, Person, submit


def _run(workspace: Workspace, name: str) -> Run:
    return Run.objects.create(
        workspace=workspace,
        name=name,
        workflow="train",
        status="succeeded",
        code_kind="git",
        repo_url="https://example.com/acme/models.git",
        commit="a" * 40,
    )


def _job(run: Run, name: str = "train", *, reads: list[dict[str, str]] | None = None, cached: Job | None = None) -> Job:
    return Job.objects.create(
        workspace=run.workspace, run=run, name=name, workflow=name, spec={}, input_refs=reads or [], cached_from=cached
    )


def _ref(kind: str, name: str, run: Run) -> dict[str, str]:
    return {"kind": kind, "name": name, "run_id": str(run.pk), "run_name": run.name}


def _graph(run: Run, depth: int = 3) -> dict[str, Any]:
    return lineage_shown(run_lineage(run=run, depth=depth))


def test_a_run_is_fed_through_a_tag_and_used_through_deps_and_the_cache(team: Workspace) -> None:
    base, tuned, evaluated = _run(team, "base-1"), _run(team, "tuned-1"), _run(team, "eval-1")
    Tag.objects.create(workspace=team, name="base", run=base)
    base_job = _job(base)
    tuned_job = _job(tuned, reads=[_ref("tag", "base", base)])
    _job(evaluated, "score", reads=[_ref("run", "tuned-1", tuned)])
    _job(evaluated, "train", cached=tuned_job)
    _job(tuned, "prep", cached=base_job)

    graph = _graph(tuned)
    assert [(r["name"], r["distance"], r["tags"]) for r in graph["runs"]] == [
        ("base-1", -1, ["base"]),
        ("tuned-1", 0, []),
        ("eval-1", 1, []),
    ]
    assert sorted((e["producer"], e["consumer"], e["kind"], e["name"], e["job"]) for e in graph["edges"]) == [
        ("base-1", "tuned-1", "cache", "prep", "prep"),
        ("base-1", "tuned-1", "tag", "base", "train"),
        ("tuned-1", "eval-1", "cache", "train", "train"),
        ("tuned-1", "eval-1", "run", "tuned-1", "score"),
    ]
    assert graph["truncated"] is False

    # Two steps away: shown at depth 2, said to be there at depth 1.
    far = _graph(evaluated, depth=2)
    assert [(r["name"], r["distance"]) for r in far["runs"]] == [("base-1", -2), ("tuned-1", -1), ("eval-1", 0)]
    near = _graph(evaluated, depth=1)
    assert [r["name"] for r in near["runs"]] == ["tuned-1", "eval-1"]
    assert near["truncated"] is True


def test_the_lineage_stops_at_its_size_bound_and_says_so(team: Workspace) -> None:
    consumer = _run(team, "wide-1")
    producers = [_run(team, f"part-{i}") for i in range(MAX_RUNS + 5)]
    _job(consumer, reads=[_ref("run", p.name, p) for p in producers])
    graph = _graph(consumer)
    assert len(graph["runs"]) == MAX_RUNS
    assert graph["truncated"] is True
    assert {e["consumer"] for e in graph["edges"]} == {"wide-1"}
    assert len(graph["edges"]) == MAX_RUNS - 1


def test_another_workspaces_runs_are_never_in_a_lineage(team: Workspace) -> None:
    other = Workspace.objects.create(slug="globex", name="Globex")
    mine, theirs = _run(team, "mine-1"), _run(other, "theirs-1")
    # Edges that cross workspaces cannot be made by a submission; stored anyway, they are not followed.
    _job(mine, reads=[_ref("run", "theirs-1", theirs)])
    _job(theirs, reads=[_ref("run", "mine-1", mine)])
    assert [r["name"] for r in _graph(mine)["runs"]] == ["mine-1"]
    assert _graph(mine)["edges"] == []


def test_a_new_run_starts_from_each_repositorys_newest_run(team: Workspace, owner: Person) -> None:
    older = submit(team, owner.user, workflow="hello")
    newer = submit(team, owner.user, workflow="train", commit="b" * 40)
    elsewhere = _run(team, "other-repo-1")
    Run.objects.filter(pk=elsewhere.pk).update(
        repo_url="https://example.com/acme/broken.git",
        workflows_files=[{"path": ".trainyard/workflows.yaml", "text": "workflows: [oops"}],
    )

    sources = run_sources(workspace=team)
    assert [(s["repo"], s["run"]) for s in sources] == [
        ("https://example.com/acme/broken.git", "other-repo-1"),
        ("https://example.com/acme/models.git", newer.name),
    ]
    broken, models = sources
    assert broken["workflows"] == []  # its files no longer parse: nothing to pick
    assert models["code"]["commit"] == "b" * 40 and models["code"]["kind"] == "git"
    assert models["workflows_files"] == [{"path": ".trainyard/workflows.yaml", "text": WORKFLOWS}]
    assert "hello" in [w["name"] for w in models["workflows"]] and "train" in [w["name"] for w in models["workflows"]]
    assert older.name not in [s["run"] for s in sources]
    assert run_sources(workspace=Workspace.objects.create(slug="empty", name="Empty")) == []
