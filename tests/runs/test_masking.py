"""Secrets are masked in the raw text of log lines, before COPY escaping: values
with special characters, values split across lines or across the runner's
64 KiB line cut (within a batch and across batches), and their base64 and
URL-encoded forms. What is stored is exactly what followers are sent. Job
and run reasons are masked too, and never hold a signed storage URL's token."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from urllib.parse import quote, quote_plus

import pytest
from trainyard_runner.protocol import MAX_LINE_BYTES, LogLineWire

from backend.accounts.models import Workspace
from backend.artifacts.storage import get_storage
from backend.clouds.models import Instance, InstanceStatus
from backend.runs.lifecycle.transitions import job_set_reason
from backend.runs.models import Job, Run
from backend.runs.scheduler.passes import jobs_schedule
from backend.runs.selectors import job_log_lines
from backend.runs.services.logs import logs_prepare_lines, logs_store
from backend.vault.models import Secret
from backend.vault.services import secret_set
from tests.support.attempts import accept, report
from tests.support.fixtures import Person
from tests.support.frames import frame_lines

TOKEN = "wandb-0123456789abcdef"


@dataclass
class Running:
    job: Job
    instance: Instance

    def store(self, first_seq: int, lines: list[tuple[str, str]]) -> list[str]:
        """Store (stream, text) lines as the runner sends them, prepared as the
        consumer prepares them; returns the texts sent to followers."""
        wire: list[LogLineWire] = [(1.0 + i, stream, text) for i, (stream, text) in enumerate(lines)]  # type: ignore[misc]
        prepared = logs_prepare_lines(job_id=str(self.job.pk), first_seq=first_seq, lines=wire)
        stored = logs_store(
            job_id=str(self.job.pk),
            instance_id=str(self.instance.pk),
            attempt=1,
            first_seq=first_seq,
            lines=wire,
            prepared=prepared,
        )
        followed = [text for _, _, _, text in frame_lines(json.loads(stored.frame))]
        assert [text for _, _, text in stored.new_lines] == followed
        return followed

    def stored(self) -> list[str]:
        return [text for _, _, _, text in job_log_lines(job_id=str(self.job.pk))]


@pytest.fixture
def running(team: Workspace, run: Run) -> Running:
    instance = Instance.objects.create(
        workspace=team,
        backend="local",
        name="l",
        token_hash="m" * 64,
        status=InstanceStatus.IDLE,
        cpus=2,
        memory_bytes=2**30,
        channel_name="c",
    )
    jobs_schedule()
    job = run.jobs.get()
    accept(job, instance.pk)
    return Running(job, instance)


def _secrets(team: Workspace, owner: Person, **values: str) -> None:
    for name, value in values.items():
        secret_set(workspace=team, user=owner.user, name=name, value=value)


def test_values_with_a_backslash_a_tab_or_a_cr_are_masked(team: Workspace, owner: Person, running: Running) -> None:
    _secrets(team, owner, BACKSLASH="ab\\cd-21600", TAB="tab\tsecret-1", CR="cr\rsecret-2")

    followed = running.store(1, [("o", "key=ab\\cd-21600"), ("e", "x tab\tsecret-1 y"), ("o", "cr\rsecret-2\r")])

    assert followed == ["key=*****", "x ***** y", "*****\r"]
    assert running.stored() == followed


def test_each_line_of_a_multi_line_value_is_masked_and_pieces_under_4_characters_are_not(
    team: Workspace, owner: Person, running: Running
) -> None:
    pem = "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\r\nBKcwggSjAgEAAoIBAQC7\nab\n-----END PRIVATE KEY-----"
    _secrets(team, owner, KEY=pem)

    followed = running.store(
        1,
        [
            ("o", "-----BEGIN PRIVATE KEY-----"),
            ("o", "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC\r"),
            ("o", "key part: BKcwggSjAgEAAoIBAQC7"),
            ("o", "ab"),
            ("o", "-----END PRIVATE KEY-----"),
        ],
    )

    assert followed == ["*****", "*****\r", "key part: *****", "ab", "*****"]
    assert running.stored() == followed


def test_every_line_of_a_long_key_and_of_a_wrapped_base64_is_masked(
    team: Workspace, owner: Person, running: Running
) -> None:
    # Many long lines: found by sampled grams rather than one search each.
    body = [base64.b64encode(bytes(range(i, i + 48))).decode() for i in range(27)]
    key = "\n".join(["-----BEGIN RSA PRIVATE KEY-----", *body, "-----END RSA PRIVATE KEY-----"])
    hex_token = "0123456789abcdef" * 4
    _secrets(team, owner, KEY=key, HEX=hex_token)
    wrapped = base64.b64encode(hex_token.encode() + b"\n").decode()  # echo "$HEX" | base64: 76 + 12 columns

    followed = running.store(
        1, [("o", "begin"), *[("o", line) for line in key.split("\n")], ("e", wrapped[:76]), ("e", wrapped[76:])]
    )

    assert followed == ["begin", *["*****"] * 29, "*****", "*****"]
    assert running.stored() == followed


def test_base64_and_url_encoded_forms_are_masked(team: Workspace, owner: Person, running: Running) -> None:
    value = "s3cr3t/va lue+42???>"
    long = "L" * 40 + "-0123456789abcdef0123456789abcdef"  # 73 bytes: `base64` wraps it at 76 columns
    _secrets(team, owner, VALUE=value, LONG=long)
    wrapped = base64.b64encode(long.encode() + b"\n").decode()

    followed = running.store(
        1,
        [
            ("o", base64.b64encode(value.encode()).decode()),  # czNjcjN0L3ZhIGx1ZSs0Mj8/Pz4=
            ("o", base64.urlsafe_b64encode(value.encode()).decode()),  # czNjcjN0L3ZhIGx1ZSs0Mj8_Pz4=
            ("o", base64.b64encode(value.encode() + b"\n").decode()),  # echo "$VALUE" | base64
            ("o", "Authorization: Basic " + base64.b64encode(b"user:" + value.encode()).decode()),
            ("o", f"GET /cb?token={quote(value, safe='')}&next=1"),
            ("o", f"q={quote_plus(value)}"),
            ("o", f"path {quote(value)}"),
            ("o", wrapped[:76]),
            ("o", wrapped[76:]),
        ],
    )

    # Of the Basic header only the groups that mix in "user:" are left:
    # dXNlcjpz encodes "user:s", the "s" sharing its bits with the prefix.
    assert followed == [
        "*****",
        "*****",
        "*****",
        "Authorization: Basic dXNlcjpz*****Pg==",
        "GET /cb?token=*****&next=1",
        "q=*****",
        "path *****",
        "*****",
        "*****",
    ]
    assert running.stored() == followed


def test_a_value_straddling_the_64_kib_cut_is_masked_on_both_sides_within_a_batch(
    team: Workspace, owner: Person, running: Running
) -> None:
    _secrets(team, owner, TOKEN=TOKEN)
    head = "x" * (MAX_LINE_BYTES - 10) + TOKEN[:10]  # a piece the runner cut: exactly MAX_LINE_BYTES

    followed = running.store(
        1,
        [("o", head), ("e", "a warning in between"), ("o", TOKEN[10:] + " done"), ("o", TOKEN[:10] + " ok")],
    )

    assert followed == ["x" * (MAX_LINE_BYTES - 10) + "*****", "a warning in between", "***** done", "wandb-0123 ok"]
    assert running.stored() == followed


def test_a_value_straddling_the_cut_across_two_batches_is_masked_on_both_sides(
    team: Workspace, owner: Person, running: Running
) -> None:
    _secrets(team, owner, TOKEN=TOKEN)
    head = "x" * (MAX_LINE_BYTES - 10) + TOKEN[:10]

    first = running.store(1, [("e", "plain"), ("o", head)])  # the rest of the line is not here yet
    second = running.store(3, [("o", TOKEN[10:] + " done")])
    # A stream whose line before was not cut: the same start is left alone.
    third = running.store(4, [("e", TOKEN[10:] + " is hex")])

    assert first == ["plain", "x" * (MAX_LINE_BYTES - 10) + "*****"]
    assert second == ["***** done"]
    assert third == ["456789abcdef is hex"]
    assert running.stored() == first + second + third


def test_a_short_start_left_by_the_cut_is_completed_by_the_next_batch(
    team: Workspace, owner: Person, running: Running
) -> None:
    _secrets(team, owner, TOKEN=TOKEN)
    head = "x" * (MAX_LINE_BYTES - 3) + TOKEN[:3]  # 3 characters: too short to mask on their own

    first = running.store(1, [("o", head)])
    second = running.store(2, [("o", TOKEN[3:])])

    assert first == [head]
    assert second == ["*****"]


def _reasons(running: Running) -> tuple[str, str]:
    job = Job.objects.select_related("run").get(pk=running.job.pk)
    return job.status_reason, job.run.status_reason


def test_a_secret_in_a_reason_from_the_runner_or_git_is_masked_in_the_job_and_its_run(
    team: Workspace, owner: Person, running: Running
) -> None:
    _secrets(team, owner, GIT_TOKEN="ab\\cd-21600")
    job_id, instance_id = str(running.job.pk), str(running.instance.pk)

    job_set_reason(
        job_id=job_id, instance_id=instance_id, attempt=1, reason="cloning https://bot:ab\\cd-21600@git.test/r.git"
    )
    progress = _reasons(running)
    report(
        running.job,
        running.instance.pk,
        "failed",
        None,
        "clone of https://bot:ab%5Ccd-21600@git.test/r.git failed (exit 128): fatal: denied (ab\\cd-21600)",
    )

    assert progress == ("cloning https://bot:*****@git.test/r.git",) * 2
    assert (
        _reasons(running) == ("clone of https://bot:*****@git.test/r.git failed (exit 128): fatal: denied (*****)",) * 2
    )


def test_a_secret_cut_short_by_the_reasons_length_limit_is_masked(
    team: Workspace, owner: Person, running: Running
) -> None:
    _secrets(team, owner, TOKEN=TOKEN)

    report(running.job, running.instance.pk, "failed", None, "e" * 990 + TOKEN + " and more")

    assert _reasons(running) == ("e" * 990 + "*****",) * 2


def test_a_reason_quoting_a_failed_download_holds_no_signed_token(running: Running) -> None:
    url = get_storage().signed_url("blobs/p.patch", method="GET")
    token = url.rsplit("/", 1)[1]
    reason = (
        f"download of the patch failed: GET {url}: HTTP 403 This link has expired. "
        f"URL can't contain control characters. '/storage/{token} x' (found at least ' '); "
        "GET https://b.s3.test/k?X-Amz-Credential=AKIA&X-Amz-Signature=0a1b: HTTP 403"
    )

    report(running.job, running.instance.pk, "failed", None, reason)

    public = url.split("/storage/", 1)[0]
    expected = (
        f"download of the patch failed: GET {public}/storage/…: HTTP 403 This link has expired. "
        "URL can't contain control characters. '/storage/… x' (found at least ' '); "
        "GET https://b.s3.test/k?…: HTTP 403"
    )
    assert len(token) > 40
    assert _reasons(running) == (expected, expected)


def test_a_secret_that_cannot_be_decrypted_leaves_the_others_masked_and_the_job_still_ends(
    team: Workspace, owner: Person, running: Running
) -> None:
    _secrets(team, owner, TOKEN=TOKEN, BROKEN="broken-secret-value-1")
    Secret.objects.filter(workspace=team, name="BROKEN").update(ciphertext=b"not a fernet token")

    ended = report(running.job, running.instance.pk, "failed", None, f"fatal: {TOKEN}")
    followed = running.store(1, [("o", f"token {TOKEN}")])

    assert ended is True
    assert _reasons(running) == ("fatal: *****", "fatal: *****")
    assert followed == running.stored() == ["token *****"]
