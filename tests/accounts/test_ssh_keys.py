"""SSH public keys: parsed for real (ed25519, ECDSA, RSA ≥ 2048 only; a
private key pasted by mistake is refused by name and not stored), the
fingerprint ``ssh-keygen -l`` prints, one user's keys only, audited in each
of the user's workspaces."""

from __future__ import annotations

import secrets
import shutil
import subprocess
from datetime import timedelta
from pathlib import Path

import pytest
from django.db import transaction
from django.utils import timezone

from backend.access.models import AccessSession, SessionKind, SessionState
from backend.accounts.models import AuditEvent, SshKey, Workspace
from backend.accounts.selectors import ssh_public_keys
from backend.accounts.services.ssh_keys import MAX_KEYS_PER_USER, ssh_key_add, ssh_key_parse
from backend.clouds.services.selfhosted import registration_token_create, runner_register
from backend.core.errors import ApplicationError
from backend.runs.lifecycle.transitions import job_assign
from backend.runs.models import Job
from tests.support.fixtures import Person, submit

pytestmark = pytest.mark.skipif(shutil.which("ssh-keygen") is None, reason="needs openssh-client's ssh-keygen")


def _keygen(tmp_path: Path, kind: str, bits: int | None = None, comment: str = "me@laptop") -> tuple[str, str, Path]:
    """A key made by the stock ssh-keygen: (public line, `ssh-keygen -l` fingerprint, private key path)."""
    path = tmp_path / f"id_{kind}_{bits or ''}"
    args = ["ssh-keygen", "-q", "-t", kind, "-N", "", "-C", comment, "-f", str(path)]
    subprocess.run([*args, *(["-b", str(bits)] if bits else [])], check=True)
    listed = subprocess.run(["ssh-keygen", "-lf", f"{path}.pub"], check=True, capture_output=True, text=True)
    return Path(f"{path}.pub").read_text(), listed.stdout.split()[1], path


@pytest.mark.parametrize(("kind", "bits"), [("ed25519", None), ("ecdsa", 256), ("ecdsa", 521), ("rsa", 3072)])
def test_a_key_of_each_accepted_type_parses_with_the_fingerprint_ssh_keygen_prints(
    tmp_path: Path, kind: str, bits: int | None
) -> None:
    line, fingerprint, _ = _keygen(tmp_path, kind, bits)

    parsed = ssh_key_parse(line)

    assert parsed.fingerprint == fingerprint
    assert parsed.line == " ".join(line.split()[:2])
    assert parsed.comment == "me@laptop"


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "The key is empty"),
        ("hello world", "This is not an OpenSSH public key line"),
        ("ssh-ed25519 not-base64!!", "does not parse"),
        ("ssh-ed25519 AAAAB3NzaC1yc2EAAAADAQABAAABAQ==", "does not parse"),
        ("ssh-dss AAAAB3NzaC1kc3M=", "DSA keys (ssh-dss) are refused"),
        ("ssh-ed25519-cert-v01@openssh.com AAAA", "This is an SSH certificate"),
        ("sk-ssh-ed25519@openssh.com AAAA", "Security-key types"),
        ("ssh-ed25519 " + "A" * 9000, "longer than 8192 characters"),
    ],
)
def test_what_is_not_an_accepted_public_key_is_refused_saying_why(text: str, says: str) -> None:
    with pytest.raises(ApplicationError) as refused:
        ssh_key_parse(text)

    assert says in refused.value.message


def test_two_lines_are_refused_one_key_at_a_time(tmp_path: Path) -> None:
    one, _, _ = _keygen(tmp_path, "ed25519")
    two, _, _ = _keygen(tmp_path, "ecdsa", 256)

    with pytest.raises(ApplicationError, match="Paste one key, on one line"):
        ssh_key_parse(one + two)


def test_a_short_rsa_key_is_refused_naming_its_size(tmp_path: Path) -> None:
    line, _, _ = _keygen(tmp_path, "rsa", 1024)

    with pytest.raises(ApplicationError, match="This RSA key has 1024 bits; at least 2048 are needed"):
        ssh_key_parse(line)


def test_a_key_whose_type_and_body_disagree_is_refused(tmp_path: Path) -> None:
    line, _, _ = _keygen(tmp_path, "ed25519")

    with pytest.raises(ApplicationError, match="does not parse"):
        ssh_key_parse(line.replace("ssh-ed25519", "ssh-rsa", 1))


@pytest.mark.django_db
def test_a_private_key_pasted_by_mistake_is_refused_by_name_and_not_stored(tmp_path: Path, member: Person) -> None:
    _, _, private = _keygen(tmp_path, "ed25519")

    answer = member.client().post("/api/v1/me/ssh-keys/", {"public_key": private.read_text()}, format="json")

    assert answer.status_code == 400
    assert answer.json()["message"].startswith("This is a PRIVATE key: it was not stored")
    assert "id_ed25519.pub" in answer.json()["message"]
    assert SshKey.objects.count() == 0


@pytest.mark.django_db
def test_a_key_added_over_the_api_is_listed_served_to_the_runner_and_audited_in_each_workspace(
    tmp_path: Path, member: Person
) -> None:
    line, fingerprint, _ = _keygen(tmp_path, "ed25519")
    workspaces = {m.workspace_id for m in member.user.memberships.all()}

    added = member.client().post("/api/v1/me/ssh-keys/", {"public_key": line}, format="json")
    listed = member.client().get("/api/v1/me/ssh-keys/")

    assert added.status_code == 201
    assert {k: added.json()[k] for k in ("name", "fingerprint", "public_key")} == {
        "name": "me@laptop",
        "fingerprint": fingerprint,
        "public_key": " ".join(line.split()[:2]),
    }
    assert [k["fingerprint"] for k in listed.json()] == [fingerprint]
    assert ssh_public_keys(member.user) == [" ".join(line.split()[:2])]
    events = AuditEvent.objects.filter(action="ssh_key.added")
    assert len(workspaces) == 2
    assert {e.workspace_id for e in events} == workspaces
    assert {(e.target, e.detail["fingerprint"], e.user_id) for e in events} == {
        ("me@laptop", fingerprint, member.user.pk)
    }


@pytest.mark.django_db
def test_the_same_key_twice_is_refused_and_a_name_given_wins_over_the_comment(tmp_path: Path, member: Person) -> None:
    line, fingerprint, _ = _keygen(tmp_path, "ed25519")

    first = member.client().post("/api/v1/me/ssh-keys/", {"public_key": line, "name": "work"}, format="json")
    again = member.client().post("/api/v1/me/ssh-keys/", {"public_key": line}, format="json")

    assert first.json()["name"] == "work"
    assert (again.status_code, again.json()["message"]) == (409, f"You have this key already ({fingerprint}).")


@pytest.mark.django_db
def test_a_users_keys_are_capped(tmp_path: Path, member: Person) -> None:
    for n in range(MAX_KEYS_PER_USER):
        SshKey.objects.create(user=member.user, name=f"k{n}", public_key="x", fingerprint=f"SHA256:{n}")
    line, _, _ = _keygen(tmp_path, "ed25519")

    refused = member.client().post("/api/v1/me/ssh-keys/", {"public_key": line}, format="json")

    assert refused.status_code == 409
    assert refused.json()["message"].startswith(f"You have {MAX_KEYS_PER_USER} SSH keys, the most one may have")


@pytest.mark.django_db
@pytest.mark.parametrize("by", ["id", "fingerprint", "bare fingerprint", "name"])
def test_a_key_is_removed_by_id_fingerprint_or_name_and_the_removal_audited(
    tmp_path: Path, member: Person, by: str
) -> None:
    line, _, _ = _keygen(tmp_path, "ed25519")
    key = ssh_key_add(user=member.user, public_key=line, name="laptop")
    ref = {"id": str(key.pk), "fingerprint": key.fingerprint, "bare fingerprint": key.fingerprint[7:], "name": "laptop"}

    removed = member.client().delete(f"/api/v1/me/ssh-keys/{ref[by]}/")

    assert removed.status_code == 204
    assert SshKey.objects.count() == 0
    assert AuditEvent.objects.filter(action="ssh_key.removed", target="laptop").count() == 2


@pytest.mark.django_db
def test_another_users_key_is_not_found_and_stays(tmp_path: Path, member: Person, outsider: Person) -> None:
    line, _, _ = _keygen(tmp_path, "ed25519")
    key = ssh_key_add(user=member.user, public_key=line, name="laptop")

    answers = [outsider.client().delete(f"/api/v1/me/ssh-keys/{ref}/") for ref in (key.pk, key.fingerprint, "laptop")]
    listed = outsider.client().get("/api/v1/me/ssh-keys/")

    assert [a.status_code for a in answers] == [404, 404, 404]
    assert answers[0].json()["message"] == f"You have no SSH key '{key.pk}' (see `trainyard ssh-key ls`)."
    assert listed.json() == []
    assert SshKey.objects.filter(pk=key.pk).exists()


@pytest.mark.django_db
def test_a_name_two_keys_share_is_refused_naming_their_fingerprints(tmp_path: Path, member: Person) -> None:
    one = ssh_key_add(user=member.user, public_key=_keygen(tmp_path, "ed25519")[0], name="laptop")
    two = ssh_key_add(user=member.user, public_key=_keygen(tmp_path, "ecdsa", 256)[0], name="laptop")

    refused = member.client().delete("/api/v1/me/ssh-keys/laptop/")

    assert refused.status_code == 400
    assert one.fingerprint in refused.json()["message"] and two.fingerprint in refused.json()["message"]
    assert SshKey.objects.count() == 2


@pytest.mark.django_db(transaction=True)
def test_removing_a_key_ends_the_owners_live_ssh_sessions_in_every_workspace_and_no_other(
    tmp_path: Path, team: Workspace, owner: Person, member: Person
) -> None:
    key = ssh_key_add(user=member.user, public_key=_keygen(tmp_path, "ed25519")[0], name="laptop")
    ssh_team = _session(team, owner, member, SessionKind.SSH)
    ssh_own = _session(member.user.personal_workspace, member, member, SessionKind.SSH)
    terminal = _session(team, owner, member, SessionKind.TERMINAL)
    owners = _session(team, owner, owner, SessionKind.SSH)

    removed = member.client().delete(f"/api/v1/me/ssh-keys/{key.fingerprint}/")

    assert removed.status_code == 204
    states = {s.pk: (s.state, s.end_reason) for s in AccessSession.objects.all()}
    said = f"the SSH key laptop ({key.fingerprint}) was removed"
    assert states[ssh_team.pk] == states[ssh_own.pk] == (SessionState.ENDED, said)
    assert states[terminal.pk] == states[owners.pk] == (SessionState.OPEN, "")


def _session(workspace: Workspace, submitter: Person, user: Person, kind: SessionKind) -> AccessSession:
    """An open session of ``user`` into a job of ``workspace`` running on a registered runner."""
    run = submit(workspace, submitter.user)
    runner = runner_register(token=registration_token_create(workspace=workspace, user=submitter.user).token,
                             name=f"box-{secrets.token_hex(3)}")  # fmt: skip
    with transaction.atomic():
        job_assign(job=Job.objects.select_for_update().get(run=run), instance=runner.instance)
    job = Job.objects.get(run=run)
    return AccessSession.objects.create(
        workspace=workspace, user=user.user, job=job, attempt=job.attempts.get(), instance=runner.instance,
        kind=kind, token_hash=secrets.token_hex(32), relay_key_hash="x", state=SessionState.OPEN,
        grant_expires_at=timezone.now() + timedelta(minutes=1),
    )  # fmt: skip
