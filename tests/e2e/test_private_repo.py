"""A private repository, end to end: real git over HTTP with Basic auth
(tests/support/git_http.py), the real stack and its local runners. Without a
credential the run fails saying what to do; with one set through the CLI it
succeeds, and the credential shows up nowhere: no log line, API answer,
status reason, server log or runner log."""

from __future__ import annotations

import base64
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.conftest import User, git, make_repo
from tests.support.git_http import GitHttpServer
from tests.support.stack import Stack

TOKEN = "ghp_e2ePrivateRepoToken9876"
USERNAME = "ci-bot"


@pytest.fixture(scope="module")
def dave(stack: Stack) -> User:
    return User("priya", stack.issue_token("priya"), stack)


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[GitHttpServer]:
    server = GitHttpServer(tmp_path / "served", username=USERNAME, password=TOKEN).start()
    yield server
    server.close()


def _private_repo(tmp_path: Path, remote: GitHttpServer) -> tuple[Path, str]:
    repo = make_repo(tmp_path / "private-train", remote=False)
    url = remote.publish(repo, "private-train.git")
    git(repo, "remote", "add", "origin", url)
    # What a fetch would record; the CLI only checks the commit is on a remote branch.
    git(repo, "update-ref", "refs/remotes/origin/main", "HEAD")
    return repo, url


def test_a_private_repo_runs_with_its_credential_which_never_shows(
    dave: User, tmp_path: Path, remote: GitHttpServer
) -> None:
    repo, url = _private_repo(tmp_path, remote)

    refused = dave.cli(repo, "run", "hello")

    run = dave.runs()[0]
    reason = run["jobs"][0]["status_reason"]
    assert refused.returncode != 0 and run["status"] == "failed"
    assert f"the repository {url} needs a credential and none is set for it" in reason, reason
    assert f"trainyard repo credential set --url {url} --https-token <token>" in reason
    assert "Traceback" not in reason

    set_ = dave.cli(repo, "repo", "credential", "set", "--https-token", "--username", USERNAME, input=TOKEN + "\n")
    assert set_.returncode == 0, set_.stderr
    assert dave.api("GET", f"/api/v1/workspaces/{dave.workspace}/repos/").json()[0]["credential"]["kind"] == (
        "https-token"
    )

    ran = dave.cli(repo, "run", "hello")

    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines()[0].startswith("hello from ")
    assert any(r.authorized for r in remote.requests)
    _assert_nowhere(dave, [ran, refused, set_])


def _assert_nowhere(user: User, outputs: list[object]) -> None:
    forms = [TOKEN, base64.b64encode(f"{USERNAME}:{TOKEN}".encode()).decode()]
    ws = f"/api/v1/workspaces/{user.workspace}"
    texts = {"cli": "".join(f"{o.stdout}{o.stderr}" for o in outputs)}  # type: ignore[attr-defined]
    for run in user.runs():
        texts[f"run {run['name']}"] = user.api("GET", f"{ws}/runs/{run['name']}/").text
        for job in user.run(run["name"])["jobs"]:
            texts[f"logs {job['id']}"] = user.api("GET", f"{ws}/jobs/{job['id']}/logs/").text
    for path in ("/repos/", "/instances/?all=1", "/runs/?page_size=500"):
        texts[path] = user.api("GET", ws + path).text
    data_dir = user.stack.data_dir
    for log in [*sorted((data_dir / "logs").glob("*.log")), *sorted((data_dir / "local-runners").glob("*.log"))]:
        texts[str(log)] = log.read_text(errors="replace")
    assert len(texts) > 6
    leaks = [(where, form) for where, text in texts.items() for form in forms if form in text]
    assert leaks == []
