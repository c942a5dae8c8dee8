"""The README's five-minute walkthrough, run as it is written.

The first shell block under "## Five-minute walkthrough" in README.md is read
from the file and run through one bash, line by line and in order, in a copy
of examples/quickstart, against the e2e stack (web, worker, beat and local
runners: what ``make run`` starts). Only three things are put in: the scratch
folder for ``/tmp/quickstart``, the stack's URL for ``make run``'s, the
user's token for ``<the token make run printed>``; ``<run>`` becomes the
newest run, as a reader would take it from ``trainyard ps``.

Each line's comment is a promise, and ``PROMISES`` holds its check, keyed by
the line as written (command and comment): a line without a check fails the
test, so the walkthrough cannot gain or change a step that nobody ran.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.e2e.conftest import User
from tests.support.stack import REPO_ROOT, Stack

README = REPO_ROOT / "README.md"
LINE_TIMEOUT_SECONDS = 180
MARK = re.compile(r"(^|\] )--- .* ---$")  # a header or attempt mark of `trainyard logs`, with its job prefix


@dataclass
class Step:
    line: str
    returncode: int
    out: str
    err: str
    run: str  # the newest run right after the line ran ("" before there was one)

    @property
    def output(self) -> str:
        return self.out + self.err


@dataclass
class Walk:
    user: User
    root: Path  # the copy of examples/quickstart

    def run(self, step: Step) -> dict[str, object]:
        assert step.run, f"no run yet after {step.line!r}"
        return self.user.run(step.run)

    def jobs(self, step: Step) -> dict[str, dict[str, object]]:
        return {str(job["name"]): job for job in self.run(step)["jobs"]}  # type: ignore[attr-defined]


Check = Callable[[Step, Walk], None]


def ok(step: Step, walk: Walk) -> None:
    assert step.returncode == 0, f"{step.line!r} exited {step.returncode}: {step.output}"


def hello(step: Step, walk: Walk) -> None:
    ok(step, walk)
    assert step.out.startswith("hello from "), step.output


def train_after_make_data(step: Step, walk: Walk) -> None:
    ok(step, walk)
    run = walk.run(step)
    jobs = walk.jobs(step)
    assert (run["workflow"], run["status"]) == ("train", "succeeded"), run
    assert jobs["make-data"]["status"] == jobs["train"]["status"] == "succeeded", jobs
    assert str(jobs["make-data"]["finished_at"]) <= str(jobs["train"]["started_at"]), jobs


def ps_lists(step: Step, walk: Walk) -> None:
    ok(step, walk)
    rows = [line for line in step.out.splitlines() if step.run in line.split()]
    assert len(rows) == 1, step.out
    [row] = rows
    assert "train" in row and "succeeded" in row, step.out


def show_jobs(step: Step, walk: Walk) -> None:
    ok(step, walk)
    assert "make-data" in step.out and "train" in step.out, step.out


def show_last_loss(step: Step, walk: Walk) -> None:
    show_jobs(step, walk)
    metrics = step.out.split("Metrics (trainyard metrics RUN):", 1)[1]
    assert re.search(r"^  train: loss [0-9.e-]+ \(step 40\)", metrics, re.MULTILINE), step.out


def loss_per_epoch(step: Step, walk: Walk) -> None:
    ok(step, walk)
    rows = [line.split() for line in step.out.splitlines()]
    [loss] = [row for row in rows if row[:2] == ["train", "loss"]]
    assert loss[3:5] == ["step", "40"] and set(loss[-1]) <= set("▁▂▃▄▅▆▇█"), step.out
    assert float(loss[6]) <= float(loss[5]) <= float(loss[7]), step.out  # min ≤ last ≤ max


def artifacts_listed(step: Step, walk: Walk) -> None:
    ok(step, walk)
    assert "./data" in step.out and "./model" in step.out, step.out
    assert re.search(r"\b[0-9a-f]{12,64}\b", step.out), f"no sha256 in: {step.out}"


def downloaded_and_excluded(step: Step, walk: Walk) -> None:
    ok(step, walk)
    assert any((walk.root / "out").rglob("*")), "nothing was downloaded into ./out"
    assert "/out/" in (walk.root / ".git" / "info" / "exclude").read_text().splitlines()


def evaluated(step: Step, walk: Walk) -> None:
    ok(step, walk)
    assert re.search(r"a=\S+ b=\S+ error=\S+", step.out), step.output


def source(job: dict[str, object]) -> str:
    cached_from = job["cached_from"]
    assert isinstance(cached_from, dict), job
    return str(cached_from["run"])


def all_reused(step: Step, walk: Walk) -> None:
    ok(step, walk)
    jobs = walk.jobs(step)
    assert all(job.get("cached_from") for job in jobs.values()), jobs
    for name, job in jobs.items():
        assert f"{name}: reused from {source(job)} (cached)" in step.output, step.output
    assert "artifacts download" in step.output, step.output


def logs_of_reused_jobs(step: Step, walk: Walk) -> None:
    ok(step, walk)
    jobs = walk.jobs(step)
    for name, job in jobs.items():
        header = f"--- {name}: reused from {source(job)} (cached) ---"
        assert header in step.out, step.out
    shown = [line for line in step.out.splitlines() if not MARK.search(line)]
    assert shown, f"no log lines under the headers: {step.out}"
    [source_run] = {source(job) for job in jobs.values()}
    source_log = walk.user.cli(walk.root, "logs", source_run)
    assert source_log.returncode == 0, source_log.stderr
    assert shown == [line for line in source_log.stdout.splitlines() if not MARK.search(line)]


def plan_reruns_make_data(step: Step, walk: Walk) -> None:
    ok(step, walk)
    assert "runs: code changed (make_data.py)" in step.out, step.out
    assert "input ./data from make-data, which runs first" in step.out, step.out


def shell_submitted(step: Step, walk: Walk) -> None:
    ok(step, walk)
    assert walk.run(step)["workflow"] == "shell", step.output
    assert step.run in step.output, step.output


def ssh_ran_inside(step: Step, walk: Walk) -> None:
    ok(step, walk)
    name, cwd = step.out.splitlines()[-2:]
    assert name == step.run, step.output  # the job's own variable, read inside the job
    assert cwd.endswith("/work"), step.output  # its working tree on the runner, not this shell's directory


def stopped(step: Step, walk: Walk) -> None:
    ok(step, walk)
    run = walk.user.wait(step.run, lambda r: r["status"] in ("stopped", "failed", "succeeded"))
    assert run["status"] == "stopped", run


# The walkthrough's lines as written, each with the check of what its comment promises.
PROMISES: dict[str, Check] = {
    "cp -r examples/quickstart /tmp/quickstart && cd /tmp/quickstart": ok,
    "git init -q && git add -A && git commit -qm init": ok,
    'export PATH="$OLDPWD/.venv/bin:$PATH" # the trainyard CLI': ok,
    "export TRAINYARD_URL=http://127.0.0.1:8000 TRAINYARD_TOKEN=<the token make run printed>": ok,
    'trainyard run hello # streams "hello from …" and exits 0': hello,
    "trainyard run train # runs make-data first, then train with ./data in place": train_after_make_data,
    "trainyard ps # recent runs: name, workflow, status, age, duration": ps_lists,
    "trainyard show <run> # the run's jobs, their dependencies and timing, and train's last loss": show_last_loss,
    "trainyard metrics <run> # train's loss, one value an epoch (the workflow's `metrics:` reads it off the log):"
    " its last value at step 40, min, max and a sparkline": loss_per_epoch,
    "trainyard artifacts list <run> # ./data and ./model, with sizes and sha256": artifacts_listed,
    "trainyard artifacts download <run> -o out/ # into ./out, which it adds to .git/info/exclude": (
        downloaded_and_excluded
    ),
    "trainyard tag add quickstart-best <run>": ok,
    "trainyard run evaluate # uses the tagged run's ./model: prints a=… b=… error=…": evaluated,
    'trainyard run train # nothing changed: "make-data: reused from <run> (cached)", the same for train,'
    " then their artifacts and the run to download them from": all_reused,
    'trainyard logs <run> # each reused job: "--- train: reused from <run> (cached) ---", then that run\'s log': (
        logs_of_reused_jobs
    ),
    'echo "# tweak" >> make_data.py': ok,
    'trainyard run train --dry-run # the plan, each job with "cache: …": make-data'
    ' "runs: code changed (make_data.py)"; train also says "input ./data from make-data, which runs first"': (
        plan_reruns_make_data
    ),
    "trainyard run shell -d # a job that stays up for you (provider: code): prints its name and returns": (
        shell_submitted
    ),
    "trainyard ssh <run> --wait -- 'echo $TRAINYARD_RUN_NAME; pwd' # once it runs: its name and working tree, from"
    " a command run inside it through the server (no port is open on its machine)": ssh_ran_inside,
    "trainyard stop <run> # it would stop by itself after 10 minutes without a session (inactivity_duration)": stopped,
}


def walkthrough_lines(readme: str) -> list[str]:
    """The lines of the first ```sh block after the walkthrough's heading, a
    comment that goes on below its line joined to it."""
    section = readme.split("## Five-minute walkthrough", 1)[1]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    lines: list[str] = []
    for line in block.splitlines():
        if line.strip().startswith("#") and lines:
            lines[-1] += " " + line.strip()[1:].strip()
        elif line.strip():
            lines.append(line)
    return lines


def normalised(line: str) -> str:
    """``command # comment`` with single spaces around the ``#``."""
    command, _, comment = line.partition(" #")
    return f"{command.strip()} # {' '.join(comment.split())}" if comment else command.strip()


def command_of(line: str) -> str:
    return line.partition(" #")[0].strip()


def test_every_line_of_the_walkthrough_has_a_check() -> None:
    lines = [normalised(line) for line in walkthrough_lines(README.read_text())]

    assert [line for line in lines if line not in PROMISES] == [], "write the check of each new line in PROMISES"
    assert [line for line in PROMISES if line not in lines] == [], "a check for a line the README no longer has"


@pytest.fixture
def walker(stack: Stack) -> User:
    """A user of its own: ``<run>`` is the newest of this user's runs."""
    return User("walker", stack.issue_token("walker"), stack)


def test_the_readme_walkthrough_does_what_its_comments_say(walker: User, tmp_path: Path) -> None:
    scratch = tmp_path / "quickstart"
    lines = walkthrough_lines(README.read_text())
    steps = _run_in_one_shell(lines, walker, scratch, tmp_path / "steps")

    walk = Walk(user=walker, root=scratch)
    for step in steps:
        PROMISES[normalised(step.line)](step, walk)


def _run_in_one_shell(lines: list[str], user: User, scratch: Path, out_dir: Path) -> list[Step]:
    """One bash runs every line in order (``cd`` and ``export`` carry over),
    each line's output and status kept in files; it stops after a failing line."""
    out_dir.mkdir()
    script = [
        "set -u",
        # <run>: the newest run, as the reader takes it from `trainyard ps`.
        "newest_run() { trainyard ps --json | python3 -c 'import json,sys; print(json.load(sys.stdin)[0][\"name\"])'; }",
    ]
    for i, line in enumerate(lines):
        command = (
            command_of(line)
            .replace("/tmp/quickstart", str(scratch))
            .replace("http://127.0.0.1:8000", user.stack.url)
            .replace("<the token make run printed>", user.token)
            .replace("<run>", '"$(newest_run)"')
        )
        script.append(f'{{ {command}\n}} >"{out_dir}/{i}.out" 2>"{out_dir}/{i}.err" </dev/null')
        script.append(f'echo $? >"{out_dir}/{i}.rc"; [ "$(cat "{out_dir}/{i}.rc")" = 0 ] || exit 0')
        script.append(f'if command -v trainyard >/dev/null; then newest_run >"{out_dir}/{i}.run" 2>/dev/null; fi')
    env = {
        "HOME": str(out_dir),
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        # The reader's git knows who they are.
        **{
            f"GIT_{who}_{what}": value
            for who in ("AUTHOR", "COMMITTER")
            for what, value in (("NAME", "Walker"), ("EMAIL", "walker@example.com"))
        },
    }
    subprocess.run(
        ["bash", "-c", "\n".join(script)],
        cwd=REPO_ROOT,
        env=env,
        check=True,
        timeout=LINE_TIMEOUT_SECONDS * len(lines),
    )
    steps = []
    for i, line in enumerate(lines):
        rc = out_dir / f"{i}.rc"
        if not rc.exists():
            break  # an earlier line failed: its check reports it
        steps.append(
            Step(
                line=line,
                returncode=int(rc.read_text()),
                out=(out_dir / f"{i}.out").read_text(),
                err=(out_dir / f"{i}.err").read_text(),
                run=(out_dir / f"{i}.run").read_text().strip() if (out_dir / f"{i}.run").exists() else "",
            )
        )
    assert steps, "the walkthrough did not run"
    if len(steps) < len(lines):
        failed = steps[-1]
        raise AssertionError(f"the walkthrough stopped at {failed.line!r} ({failed.returncode}): {failed.output}")
    return steps
