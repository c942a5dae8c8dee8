"""A job acceptance lost on its way to the server never runs the job twice.

The stack drops the next acceptance (TRAINYARD_TEST_DROP_ACCEPTANCES): the
runner has the job but no confirmation, so it runs nothing; the lease runs
out, the server tells the runner the attempt is over and gives the job out
again; the commands run exactly once (a marker file counts the runs)."""

from __future__ import annotations

from pathlib import Path

from tests.e2e.conftest import User, run_name_of

WORKFLOWS = """workflows:
  - name: once
    provider: bash
    commands:
      - echo "ran attempt $TRAINYARD_ATTEMPT" >> "$MARKER"
      - echo done
"""


def test_a_dropped_acceptance_never_runs_the_commands_twice(alice: User, repo: Path, tmp_path: Path) -> None:
    (repo / ".trainyard" / "workflows.yaml").write_text(WORKFLOWS)
    marker = tmp_path / "runs.txt"
    drops = alice.stack.data_dir / "drop-acceptances"
    drops.write_text("drop the next acceptance\n")

    name = run_name_of(alice.cli(repo, "run", "once", "-d", "-e", f"MARKER={marker}"))
    run = alice.wait(name, lambda r: r["status"] in ("succeeded", "failed"), timeout=90)

    assert run["status"] == "succeeded", run
    assert drops.read_text() == ""  # the hook did drop one
    attempts = run["jobs"][0]["attempts"]
    assert [a["reason"] for a in attempts] == ["lease_expired", "done"]
    assert marker.read_text() == "ran attempt 2\n"
