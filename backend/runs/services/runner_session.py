"""What the server does with each frame a runner sends on ``/ws/runner/``.

One function a frame (and ``runner_authenticate`` for the connect): each
does the frame's database work in one synchronous call and returns what the
consumer (``consumers/runner.py``) does next, in the order a ``Reply``
gives: send its frames, run its ``after_sending`` work, ask for a
scheduling pass. Nothing here sends on the socket or asks for a pass. A
runner waits for ``JobConfirmed`` before its commands start, so what may
follow it (the acceptance's run publication, held with
``events.publishing_held``, and the check for jobs waiting on it) comes
after it is sent; a pass requested while the broker is down holds its
caller up to a minute, so the consumer asks for it last, from a thread that
is not a database thread. Which thread runs each call is the consumer's
choice.

Log frames are stored by ``logingest.LogIngest``, not here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

from django.conf import settings
from trainyard_runner import protocol

from backend.clouds.services.instances import (
    instance_bootstrap_exchange,
    instance_for_bootstrap_token,
    instance_for_token,
    instance_keep_until,
    instance_refusal,
)
from backend.core.testhooks import file_hook_fires
from backend.runs.events import publish_runs, publishing_held
from backend.runs.lifecycle.guards import attempt_commands_started
from backend.runs.lifecycle.kept import job_keep
from backend.runs.lifecycle.transitions import (
    attempt_end,
    job_accept,
    job_awaited_running,
    job_report_final,
    job_set_reason,
)
from backend.runs.models import Attempt
from backend.runs.reasons import TerminationReason
from backend.runs.scheduler.handover import instance_assign_next
from backend.runs.services.environments import environment_record
from backend.runs.services.loglimits import logs_check
from backend.runs.services.runners import runner_connect

logger = logging.getLogger(__name__)

FINAL_STATES = frozenset({"succeeded", "failed", "stopped", "interrupted"})
PROGRESS = {
    "preparing": "preparing the code",
    "running": "the commands are running",
    "uploading": "uploading artifacts",
}
STALE = "this attempt is not the job's current one on this runner (it was moved, stopped or fenced)"
NOT_HELD = "this runner no longer holds the job (lease expired, stopped or moved)"

# What the consumer sends a runner on its own socket.
Answer = protocol.Welcome | protocol.JobConfirmed | protocol.Refused | protocol.LogAck


@dataclass(frozen=True)
class Reply:
    """What the consumer does after a frame, in this order: send ``frames``;
    run ``after_sending`` off the shared database thread (database work that
    must follow them; it returns whether a pass is wanted); ask for a
    scheduling pass if ``ask_for_a_pass`` or ``after_sending`` said so."""

    frames: tuple[Answer, ...] = ()
    after_sending: Callable[[], bool] | None = None
    ask_for_a_pass: bool = False


@dataclass(frozen=True)
class Authenticated:
    """Who a connecting runner is: ``instance_id`` "" when refused, with
    ``refusal`` saying why when there is more to say than "unknown token"."""

    instance_id: str = ""
    bootstrap: bool = False  # it came with its machine's single-use bootstrap token
    refusal: str = ""


@dataclass(frozen=True)
class Greeting:
    """The answer to a hello: ``instance_id`` "" when refused, and then the
    connection closes with ``close_code`` and ``close_reason``. ``replaced``:
    the channel of the runner's previous connection, told to close."""

    instance_id: str = ""
    reply: Reply = Reply()
    replaced: str = ""
    close_code: int = 0
    close_reason: str = ""


def runner_authenticate(*, token: str) -> Authenticated:
    """The instance of a runner token, else of an unspent bootstrap token."""
    instance = instance_for_token(token=token)
    if instance is not None:
        return Authenticated(str(instance.pk))
    instance = instance_for_bootstrap_token(token=token)
    if instance is not None:
        return Authenticated(str(instance.pk), bootstrap=True)
    # A revoked runner is told so, and stops (4401 is fatal to it).
    return Authenticated(refusal=instance_refusal(token=token))


def runner_hello(
    *, instance_id: str, hello: protocol.Hello, channel_name: str, bootstrap_token: str, address: str = ""
) -> Greeting:
    """A bootstrap token is spent first, whatever follows (a second hello
    with it is refused); the runner then gets its own token in the Welcome.
    A hello while another connection of the runner is live is refused
    (``CLOSE_IN_USE``, not fatal: the runner retries).
    ``runner_connect`` reconciles what the runner holds; once the Welcome is
    sent, the idle runner takes its next job (``runner_idle``) and a pass
    is asked for."""
    own_token = ""
    if bootstrap_token:
        own_token = instance_bootstrap_exchange(instance_id=instance_id, token=bootstrap_token) or ""
        if not own_token:
            return Greeting(close_code=protocol.CLOSE_UNAUTHORIZED, close_reason="bootstrap token already used")
    connected = runner_connect(
        instance_id=instance_id,
        hello=hello,
        channel_name=channel_name,
        heartbeat_seconds=settings.TRAINYARD["HEARTBEAT_SECONDS"],
        address=address,
    )
    if connected.instance is None or connected.welcome is None:
        logger.warning("refusing a runner's hello: %s", connected.refusal)
        return Greeting(close_code=connected.close_code, close_reason=connected.refusal[:120])
    connected_id = str(connected.instance.pk)
    welcome = connected.welcome.model_copy(update={"token": own_token}) if own_token else connected.welcome
    return Greeting(
        instance_id=connected_id,
        reply=Reply((welcome,), after_sending=partial(runner_idle, instance_id=connected_id), ask_for_a_pass=True),
        replaced=connected.previous_channel if connected.previous_channel != channel_name else "",
    )


def runner_idle(*, instance_id: str) -> bool:
    """The runner is idle (it said hello, or finished a job): it takes the
    oldest pending job it fits now, not after a pass
    (``instance_assign_next``). Should that fail, the pass asked for next
    assigns it. False: this asks for no pass of its own."""
    try:
        instance_assign_next(instance_id=instance_id)
    except Exception:
        logger.exception("runner %s: handing it the next job failed; the pass will", instance_id)
    return False


def runner_job_accepted(*, instance_id: str, message: protocol.JobAccepted) -> Reply:
    """``job_accept``, its runs' publication held until after the
    ``JobConfirmed`` is sent; then, a pass when a pending job waits for
    this one to be running (the workers of a master). A refused
    acceptance changed nothing, so it has nothing to publish."""
    if _drop_acceptance_for_tests():
        return Reply()
    with publishing_held() as changed:
        accepted = job_accept(
            job_id=message.job,
            instance_id=instance_id,
            attempt=message.attempt,
            lease=message.lease,
            ports=message.ports,
        )
    if not accepted:
        return Reply((protocol.Refused(job=message.job, attempt=message.attempt, reason=NOT_HELD),))
    return Reply(
        (protocol.JobConfirmed(job=message.job, attempt=message.attempt),),
        after_sending=partial(_confirmed, changed, message.job),
    )


def _confirmed(changed: list[str], job_id: str) -> bool:
    publish_runs(changed)
    return job_awaited_running(job_id=job_id)


def runner_job_rejected(*, instance_id: str, message: protocol.JobRejected) -> Reply:
    """The runner refused an assignment: its attempt ends ``rejected`` (if
    it is still the current one and the lease is the frame's), and a pass
    gives the job out again."""
    attempt = Attempt.objects.current(job_id=message.job, number=message.attempt, instance_id=instance_id).first()
    if attempt is not None and attempt.lease == message.lease:
        attempt_end(
            attempt_id=str(attempt.pk),
            reason=TerminationReason.REJECTED,
            message=f"a runner refused it: {message.reason}",
        )
    return Reply(ask_for_a_pass=True)


def runner_job_state(*, instance_id: str, message: protocol.JobState) -> Reply:
    """A job's state on the runner, with its environment when it names one.

    A progress state (``PROGRESS``) becomes the job's reason. A final one
    (``FINAL_STATES``) ends the attempt (``job_report_final``); then the
    runner, idle unless it was interrupted (it winds down), takes its next
    job, the attempt's log is checked against the runner's count and digest
    (runners that do not say are not checked), and a pass is asked for. A
    final state of an attempt that is not the runner's current one is
    refused (``STALE``)."""
    if message.environment is not None:
        environment_record(
            job_id=message.job, instance_id=instance_id, attempt=message.attempt, report=message.environment
        )
    if message.state not in FINAL_STATES:
        if message.state == "running":
            attempt_commands_started(job_id=message.job, instance_id=instance_id, attempt=message.attempt)
        reason = message.reason or PROGRESS[message.state]
        job_set_reason(job_id=message.job, instance_id=instance_id, attempt=message.attempt, reason=reason)
        return Reply()
    kept = message.kept_until if message.state == "failed" else None
    if kept is not None:  # before the attempt's end makes the machine idle
        instance_keep_until(instance_id=instance_id, kept_until=kept)
    reported = job_report_final(
        job_id=message.job,
        instance_id=instance_id,
        attempt=message.attempt,
        state=message.state,
        exit_code=message.exit_code,
        reason=message.reason,
        interrupt_at=message.interrupt_at,
    )
    if not reported:
        return Reply((stale(message.job, message.attempt),), ask_for_a_pass=True)
    if kept is not None:
        job_keep(job_id=message.job, instance_id=instance_id, attempt=message.attempt, kept_until=kept)
    if message.state != "interrupted":
        runner_idle(instance_id=instance_id)
    if message.log_lines is not None:
        logs_check(job_id=message.job, attempt=message.attempt, lines=message.log_lines, digest=message.log_digest)
    return Reply(ask_for_a_pass=True)


def stale(job: str, attempt: int) -> protocol.Refused:
    """The refusal of a frame about an attempt this runner no longer holds."""
    return protocol.Refused(job=job, attempt=attempt, reason=STALE)


def _drop_acceptance_for_tests() -> bool:
    """Test hook (TRAINYARD_TEST_DROP_ACCEPTANCES=<file>): each line of the
    file drops one acceptance, as a lost frame would."""
    return file_hook_fires("TEST_DROP_ACCEPTANCES", "dropping a job acceptance")
