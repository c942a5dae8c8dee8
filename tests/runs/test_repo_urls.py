"""A credential in a repository URL (``https://token@host/…``, ``https://user:pass@host/…``)
is stored nowhere and shown to nobody: not on the run, not on the repo, not in a clone error."""

from __future__ import annotations

import pytest

from backend.accounts.models import Workspace
from backend.repos.models import Repo
from backend.runs.lifecycle.redaction import job_reason_clean
from backend.runs.models import Run
from backend.vault.models import RepoCredential
from tests.support.fixtures import WORKFLOWS, Person

BASE = "/api/v1/workspaces/acme"
SECRET = "ghp_Tok42inTheUrl"


def _submit(person: Person, repo_url: str) -> dict[str, object]:
    body = {
        "workflow": "hello",
        "workflows_file": {"path": ".trainyard/workflows.yaml", "text": WORKFLOWS},
        "code": {"kind": "git", "repo_url": repo_url, "commit": "b" * 40},
    }
    answer = person.client().post(f"{BASE}/runs/", body, format="json")
    assert answer.status_code == 201, answer.content
    return answer.json()


@pytest.mark.parametrize(
    ("submitted", "stored"),
    [
        (f"https://{SECRET}@github.com/acme/models.git", "https://github.com/acme/models.git"),
        (f"https://ci-bot:{SECRET}@github.com/acme/models.git", "https://github.com/acme/models.git"),
        (f"http://ci-bot:{SECRET}@git.example.test:8080/models", "http://git.example.test:8080/models"),
        (f"ssh://git:{SECRET}@git.example.test/acme/models.git", "ssh://git@git.example.test/acme/models.git"),
    ],
)
def test_a_credential_in_a_submitted_repo_url_is_stored_nowhere_and_shown_to_no_viewer(
    team: Workspace, member: Person, viewer: Person, submitted: str, stored: str
) -> None:
    created = _submit(member, submitted)
    detail = viewer.client().get(f"{BASE}/runs/{created['name']}/")
    listed = viewer.client().get(f"{BASE}/runs/")
    repos = viewer.client().get(f"{BASE}/repos/")

    assert created["code"]["repo_url"] == stored  # type: ignore[index]
    assert detail.json()["code"]["repo_url"] == stored
    assert [r["url"] for r in repos.json()] == [stored]
    assert (Run.objects.get().repo_url, Repo.objects.get().url) == (stored, stored)
    for body in (detail.content, listed.content, repos.content):
        assert SECRET.encode() not in body


def test_ssh_and_plain_urls_are_kept_as_they_are(team: Workspace, member: Person) -> None:
    for url in ("git@github.com:acme/models.git", "ssh://git@github.com/acme/models.git", "https://github.com/a/b"):
        assert _submit(member, url)["code"]["repo_url"] == url  # type: ignore[index]


def test_a_run_stored_with_a_credential_before_the_fix_shows_none(team: Workspace, viewer: Person, run: Run) -> None:
    Run.objects.filter(pk=run.pk).update(repo_url=f"https://{SECRET}@example.com/acme/models.git")
    Repo.objects.filter(pk=run.repo_id).update(url=f"https://bot:{SECRET}@example.com/acme/models.git")

    detail = viewer.client().get(f"{BASE}/runs/{run.name}/")
    repos = viewer.client().get(f"{BASE}/repos/")

    assert detail.json()["code"]["repo_url"] == "https://example.com/acme/models.git"
    assert repos.json()[0]["url"] == "https://example.com/acme/models.git"
    assert SECRET.encode() not in detail.content + repos.content


def test_a_credential_set_for_a_url_with_a_token_in_it_is_the_stripped_repos(
    team: Workspace, owner: Person, member: Person
) -> None:
    answer = owner.client().put(
        f"{BASE}/repos/credential/",
        {"url": f"https://{SECRET}@github.com/acme/models.git", "kind": "https-token", "secret": "glpat-other-token"},
        format="json",
    )
    _submit(member, f"https://{SECRET}@github.com/acme/models.git")

    assert answer.status_code == 200
    assert list(Repo.objects.values_list("url", flat=True)) == ["https://github.com/acme/models.git"]
    assert RepoCredential.objects.get().repo.runs.count() == 1


@pytest.mark.parametrize(
    ("reason", "shown"),
    [
        (
            f"clone of https://{SECRET}@github.com/acme/m.git failed (exit 128): fatal: could not read",
            "clone of https://*****@github.com/acme/m.git failed (exit 128): fatal: could not read",
        ),
        (
            f"fatal: unable to access 'https://ci-bot:{SECRET}@github.com/acme/m.git/': 403",
            "fatal: unable to access 'https://ci-bot:*****@github.com/acme/m.git/': 403",
        ),
        (
            f"the repository ssh://git:{SECRET}@host/m.git refused the ssh-key credential",
            "the repository ssh://git:*****@host/m.git refused the ssh-key credential",
        ),
        ("clone of ssh://git@host/m.git failed", "clone of ssh://git@host/m.git failed"),
    ],
)
def test_a_clone_error_from_the_runner_is_stored_without_the_urls_credential(
    team: Workspace, run: Run, reason: str, shown: str
) -> None:
    assert job_reason_clean(job_id=run.jobs.get().pk, reason=reason) == shown
