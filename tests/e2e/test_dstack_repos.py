"""A dstack 0.x-style repo runs as it is, end to end: workflows split over
.dstack/workflows/*.yaml (one depending on another's artifacts), an env list
with a bare name from the submitting shell, ``-- args`` and a variables file,
next to a dev environment and a broken workflow that are not run."""

from __future__ import annotations

import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from tests.e2e.conftest import User, commit_all, run_name_of

DATA = """\
workflows:
  - name: dstack-prepare
    help: Writes the dataset
    provider: bash
    commands:
      - mkdir -p data && echo rows=42 > data/rows.txt
    artifacts:
      - path: ./data
"""
TRAIN = """\
workflows:
  - name: dstack-train
    help: Reads the dataset
    provider: bash
    python: 3.10
    deps:
      - workflow: dstack-prepare
    env:
      - DSTACK_E2E_SETTING
      - EPOCHS=3
    commands:
      - echo "$(cat data/rows.txt) setting=$DSTACK_E2E_SETTING epochs=$EPOCHS"
      - printf 'arg=%s\\n' ${{ run.args }}
      - echo "lr=${{ variables.lr }}"
  - name: dstack-ide
    provider: code
    setup: [pip install jupyter]
  - name: dstack-broken
    provider: bash
    comands: [echo never]
"""


def test_a_dstack_repo_runs_as_it_is(alice: User, repo: Path) -> None:
    folder = repo / ".dstack" / "workflows"
    folder.mkdir(parents=True)
    (folder / "data.yaml").write_text(DATA)
    (folder / "train.yaml").write_text(TRAIN.replace("    python: 3.10\n", ""))
    (repo / ".dstack" / "variables.yaml").write_text("variables:\n  dstack-train:\n    lr: 0.001\n")
    commit_all(repo, "dstack workflows")

    result = alice.cli(
        repo,
        "run",
        "dstack-train",
        "--",
        "--name",
        "it's a test",
        env={"DSTACK_E2E_SETTING": "from-my-shell"},
    )

    assert result.returncode == 0, result.stderr
    # The shell's value reached the job (over the runner's fetch) and is masked in its log, as a secret.
    assert result.stdout == (
        "[dstack-train] rows=42 setting=***** epochs=3\n"
        "[dstack-train] arg=--name\n"
        "[dstack-train] arg=it's a test\n"
        "[dstack-train] lr=0.001\n"
    )
    assert "warning: workflow 'dstack-broken' cannot be run:" in result.stderr


def test_without_the_shell_value_nothing_is_submitted(alice: User, repo: Path) -> None:
    folder = repo / ".dstack" / "workflows"
    folder.mkdir(parents=True)
    (folder / "data.yaml").write_text(DATA)
    (folder / "train.yaml").write_text(TRAIN)
    commit_all(repo, "dstack workflows")
    before = len(alice.runs())

    result = alice.cli(repo, "run", "dstack-train", "-e", "lr=1")

    assert (result.returncode, len(alice.runs())) == (1, before)
    assert result.stderr == (
        ".dstack/workflows/train.yaml:9: workflows[0] (dstack-train).env[0]: 'DSTACK_E2E_SETTING' takes its "
        "value from the shell that runs trainyard, where it is not set\n"
    )


SERVE = """\
workflows:
  - name: dstack-serve
    provider: bash
    ports: 1
    commands:
      - echo "served on $PORT_0" > index.html
      - python3 -m http.server "$PORT_0" --bind 127.0.0.1
"""


def _until(what: str, check: Any, timeout: float) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.3)
    raise AssertionError(f"timed out after {timeout:.0f}s waiting for {what}")


def test_ports_1_gives_the_job_a_free_port_that_the_test_reaches(alice: User, repo: Path) -> None:
    (repo / ".dstack").mkdir()
    (repo / ".dstack" / "workflows.yaml").write_text(SERVE)
    commit_all(repo, "a server on a port of its own")
    name = run_name_of(alice.cli(repo, "run", "dstack-serve", "-d"))

    job = _until("the job to run with its port", lambda: (j := alice.run(name)["jobs"][0])["ports"] and j, 60)
    [port] = job["ports"]
    page = _until("the page", lambda: _get(f"http://127.0.0.1:{port}/index.html"), 30)
    assert page == f"served on {port}\n"
    shown = alice.cli(repo, "show", name)
    assert f"  dstack-serve: port {port} on {job['instance']}" in shown.stdout, shown.stdout

    assert alice.cli(repo, "stop", name).returncode == 0
    assert alice.wait(name, lambda r: r["status"] == "stopped", timeout=60)["status"] == "stopped"


def _get(url: str) -> str:
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:
            return str(answer.read().decode())
    except OSError:
        return ""


MOUNTED = """\
workflows:
  - name: dstack-mounted
    provider: bash
    artifacts:
      - path: ./output
        mount: true
    commands:
      - echo hello > output/hello.txt
      - until [ -e "$CONTROL" ]; do sleep 0.2; done
      - echo bye > output/bye.txt
"""


def test_a_mounted_artifact_can_be_browsed_while_the_job_runs(alice: User, repo: Path, tmp_path: Path) -> None:
    """output/ exists before the commands (they write into it at once); its
    live upload shows hello.txt while the job still runs; the final upload
    has both files and replaces the live one."""
    (repo / ".dstack").mkdir()
    (repo / ".dstack" / "workflows.yaml").write_text(MOUNTED)
    commit_all(repo, "a folder synced while the job runs")
    control = tmp_path / "go-on"
    name = run_name_of(alice.cli(repo, "run", "dstack-mounted", "-d", "-e", f"CONTROL={control}"))

    def listed() -> list[str]:
        answer = alice.api("GET", f"/api/v1/workspaces/{alice.workspace}/runs/{name}/artifacts/")
        return sorted(f["path"] for a in answer.json() if a["status"] == "complete" for f in a["files"])

    live = _until("the live upload of output/", listed, 40)
    assert live == ["hello.txt"]
    assert alice.run(name)["status"] == "running", "seen while the job runs"

    control.touch()
    done = alice.wait(name, lambda r: r["status"] in ("succeeded", "failed"), timeout=60)
    assert done["status"] == "succeeded", done
    assert listed() == ["bye.txt", "hello.txt"]
    answer = alice.api("GET", f"/api/v1/workspaces/{alice.workspace}/runs/{name}/artifacts/").json()
    assert len(answer) == 1, "one artifact: the final upload replaced the live one"


CACHED = """\
workflows:
  - name: dstack-cached
    provider: bash
    cache:
      - path: ./models
    commands:
      - 'if [ -f models/marker ]; then echo "cache hit: $(cat models/marker)"; else echo "cache miss"; fi'
      - mkdir -p models && echo "from run $TRAINYARD_RUN_NAME" > models/marker
"""


def test_a_cache_saved_by_one_run_is_restored_in_the_next(alice: User, repo: Path) -> None:
    (repo / ".dstack").mkdir()
    (repo / ".dstack" / "workflows.yaml").write_text(CACHED)
    commit_all(repo, "a cached folder")

    first = alice.cli(repo, "run", "dstack-cached")
    assert first.returncode == 0, first.stderr
    assert first.stdout == "cache miss\n"
    first_name = alice.runs()[0]["name"]
    second = alice.cli(repo, "run", "dstack-cached")
    assert second.returncode == 0, second.stderr
    assert second.stdout == f"cache hit: from run {first_name}\n"


PY310 = """\
workflows:
  - name: dstack-py
    provider: bash
    python: 3.10
    commands:
      - python -c 'import sys; print("python %d.%d" % sys.version_info[:2])'
"""


def test_python_3_10_unquoted_selects_3_10_or_names_the_missing_interpreter(alice: User, repo: Path) -> None:
    (repo / ".dstack").mkdir()
    (repo / ".dstack" / "workflows.yaml").write_text(PY310)
    commit_all(repo, "python: 3.10 as dstack files write it")
    result = alice.cli(repo, "run", "dstack-py")
    if _runs("python3.10"):
        assert (result.returncode, result.stdout) == (0, "python 3.10\n"), result.stderr
    else:
        assert result.returncode != 0
        assert "python 3.10 is not installed on this runner's machine" in result.stdout + result.stderr


def _runs(binary: str) -> bool:
    found = shutil.which(binary)
    return found is not None and subprocess.run([found, "--version"], capture_output=True).returncode == 0


def test_an_absolute_artifact_path_is_refused_on_the_servers_own_host(alice: User, repo: Path, tmp_path: Path) -> None:
    """The local backend runs jobs on the server's host: a job there may not
    upload from (or restore to) an absolute path; the job fails saying so."""
    outside = tmp_path / "conda-env"
    (repo / ".dstack").mkdir()
    (repo / ".dstack" / "workflows.yaml").write_text(
        "workflows:\n  - name: dstack-abs\n    provider: bash\n"
        f"    commands: ['mkdir -p {outside} && echo x > {outside}/f']\n    artifacts: ['{outside}']\n"
    )
    commit_all(repo, "an artifact outside the working directory")
    result = alice.cli(repo, "run", "dstack-abs")
    assert result.returncode != 0
    assert "this runner takes no absolute paths (the local backend runs on the server's own host)" in (
        result.stdout + result.stderr
    )


TAGGED = """\
workflows:
  - name: dstack-make-data
    provider: bash
    commands:
      - mkdir -p data && echo "rows=7" > data/rows.txt
    artifacts:
      - ./data
  - name: dstack-use-tag
    provider: bash
    deps:
      - ":dstack-data"
    commands:
      - cat data/rows.txt
  - name: dstack-notebook
    provider: notebook
    setup: [pip install jupyterlab]
    version: 6.5.4
"""


def test_a_tag_written_as_a_bare_reference_is_a_dependency_and_a_dev_environments_version_refuses_alone(
    alice: User, repo: Path
) -> None:
    (repo / ".dstack").mkdir()
    (repo / ".dstack" / "workflows.yaml").write_text(TAGGED)
    commit_all(repo, "a tag dependency the dstack way")
    made = alice.cli(repo, "run", "dstack-make-data")
    assert made.returncode == 0, made.stderr
    source = alice.runs()[0]["name"]
    tagged = alice.cli(repo, "tag", "add", "dstack-data", source)
    assert tagged.returncode == 0, tagged.stderr

    used = alice.cli(repo, "run", "dstack-use-tag")
    assert (used.returncode, used.stdout) == (0, "rows=7\n"), used.stderr

    refused = alice.cli(repo, "run", "dstack-notebook")
    assert refused.returncode != 0
    assert "version: not supported yet: version: 6.5.4 (notebook runs notebook==7.6.5)" in refused.stderr, (
        refused.stderr
    )
