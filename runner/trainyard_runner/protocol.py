"""Every message between a runner and the server, in one place.

The runner connects one websocket to ``/ws/runner/`` with the header
``Authorization: Bearer <runner token>`` and sends ``Hello`` first. After
that both sides send JSON text frames, each one of the models below; the
``type`` field tells which. The backend imports this module from the runner
package, never the reverse.

Delivery of log lines is at-least-once from the runner and exactly-once in
storage: the runner numbers a job's lines from the assignment's
``seq_base + 1`` (``seq``; seqs continue across attempts, so a job has one
ordered log), the server stores lines it has not stored yet and answers
``LogAck`` with the highest seq that is stored for that job. The runner keeps
every line above the acknowledged seq in its spool and resends from there
after a reconnect.

Fencing: every message about a job names its ``attempt``. The server
listens only to the job's current attempt on the runner's own instance; to
anything else it answers ``Refused``, and the runner stops that attempt.
A runner starts a job's commands only after ``JobConfirmed`` (or the job
listed in ``Welcome.confirmed`` after a reconnect), so a lost acceptance can
never run a job twice.

No secret crosses the websocket: the server's side of it goes through
the channel layer (Redis, written to disk). ``AssignJob.secrets`` only says
the job has secrets or a clone credential; the runner fetches them
(``JobSecrets``) over REST with its token, as it fetches the file lists of
the job's inputs page by page (``InputPage``), so an assignment stays small
whatever the inputs hold. Both endpoints answer only the runner holding the
job's current attempt (docs/RUNNER.md, "Secrets and input manifests").

Log batches travel in the stored form: a ``Logs`` frame is one chunk, the
lines' text as one string with one stream letter per line and runs of
times, which the server stores and fans out without per-line work.

Everything a runner sends is bounded here (docs/RUNNER.md, "Bounds"), so the
server never reads more of a frame than it keeps
(docs/decisions/0081-linear-redaction.md). Free text (a reason, a hostname, a GPU's
name) is cut to its bound, on both sides: a long git error is not a bad frame.
Identifiers the runner echoes (a job, a lease) and lists (held jobs, ports,
GPUs) above their bound are a bad frame (4400): no runner reaches them.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from itertools import groupby
from operator import itemgetter
from typing import Annotated, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, TypeAdapter, model_validator

PROTOCOL_VERSION = 8

# A log line in memory: [unix time in seconds, stream, text]; stream is "o"
# (stdout) or "e" (stderr). On the wire lines travel as a ``Logs`` chunk.
# A line's time is a unix time: finite and not before 1970 (a NaN or a
# negative time is a bad frame, answered by closing the connection).
LogTime = Annotated[float, Field(ge=0, allow_inf_nan=False)]
LogLineWire = tuple[LogTime, Literal["o", "e"], str]
NEWLINE_STANDIN = "\u2424"  # ␤: a "\n" inside a line is sent (and stored) as this
# Lines in one ``Logs`` frame at most (the runner sends up to 5000).
MAX_FRAME_LINES = 20_000

# A line longer than MAX_LINE_BYTES of UTF-8 reaches the server as pieces: the
# runner cuts it at a character boundary at most MAX_LINE_BYTES in, and the
# next line of the same stream continues it. Frames do not mark the pieces;
# every runner's piece is at least CUT_MIN_BYTES long, and that is how the
# server tells them (``may_be_cut``), so masking can follow a secret across a
# cut.
MAX_LINE_BYTES = 64 * 1024
CUT_MIN_BYTES = MAX_LINE_BYTES - 3  # a cut backs off at most 3 bytes of a character
CUT_MIN_CHARS = CUT_MIN_BYTES // 4  # a character is at most 4 bytes


def may_be_cut(text: str) -> bool:
    """Whether ``text`` may be a piece of a longer line (the next line of its
    stream continues it). True for every piece; also for the rare whole line
    that long, which only makes the server's masking more careful."""
    if len(text) < CUT_MIN_CHARS:
        return False
    return len(text.encode("utf-8", "surrogatepass")) >= CUT_MIN_BYTES


# The end-of-log check (docs/RUNNER.md, "Log digest"): a final JobState names
# how many lines the attempt shipped and their digest: the CRC-32 of their
# text in the chunk form (UTF-8 with surrogates passed through, every line
# followed by "\n", a "\n" inside a line as NEWLINE_STANDIN) and the CRC-32
# of their stream letters, both running over the attempt's lines in seq
# order. A running checksum continues over any split of the lines into
# batches at C speed, and its state is one number the server keeps in the
# database between batches (it stores an attempt's lines in seq order).


def log_digest_add(state: int, streams: str, text: bytes) -> int:
    """The digest ``state`` continued over a chunk: ``streams`` (one letter
    per line) and ``text`` (the lines in the chunk form, as UTF-8)."""
    return zlib.crc32(text, state >> 32) << 32 | zlib.crc32(streams.encode("ascii"), state & 0xFFFFFFFF)


def log_digest_lines(state: int, lines: Sequence[tuple[str, str]]) -> int:
    """``log_digest_add`` of ``(stream, text)`` lines (texts without "\n")."""
    text = chunk_text([t for _, t in lines]).encode("utf-8", "surrogatepass")
    return log_digest_add(state, "".join([s for s, _ in lines]), text)


def log_digest_hex(state: int) -> str:
    return f"{state:016x}"


# Bounds on what a runner sends (docs/RUNNER.md, "Bounds").
# A JobState's reason: the server keeps 1000 characters once credentials and
# signed URLs in it are shortened, and reads no more than this of it.
MAX_REASON_CHARS = 4096
MAX_REJECTION_CHARS = 1000  # JobRejected.reason: the runner's own refusal ("busy with job …")
# A name or a fact about the machine (hostname, address, version, a GPU's
# name, cloud identity, platform facts): the server keeps 255 at most.
MAX_NAME_CHARS = 255
MAX_ID_CHARS = 64  # a job id or a lease, as the server sent it (36 and 32 characters; a lease column holds 64)
MAX_IDENTITY_CHARS = 16 * 1024  # CloudIdentity.document and .signature (AWS's are about 1-2 KiB)
MAX_HELD_JOBS = 64  # Hello.running_jobs (a runner holds one job and the finished ones it still reports)
MAX_PORTS = 64  # JobAccepted.ports, HeldJob.ports: AssignJob.port_count at most
MAX_GPUS = 64  # Resources.gpus
# Heartbeat.kept_until and JobState.kept_until: the server holds a machine for kept files at most this long ahead.
MAX_KEPT_SECONDS = 7 * 24 * 3600
MAX_PLATFORM_FACTS = 32  # EnvironmentReport.platform (the runner sends 5)
# A Logs frame's text: the server's message limit (uvicorn's ws_max_size,
# 16 MiB); the runner's batches stay under 2 MiB (logstream.MAX_BATCH_BYTES).
MAX_LOG_TEXT_CHARS = 16 << 20
MAX_HOST_KEY_CHARS = 1024  # Hello.ssh_host_key: one OpenSSH public key line (an ed25519 one is about 100)
# A Metrics frame (docs/METRICS.md): the runner sends one every few seconds.
MAX_SYSTEM_SAMPLES = 120  # Metrics.system: ten minutes of 5 s samples kept while the server was away
MAX_TRAINING_VALUES = 2000  # Metrics.training: the per-minute cap's worth and then some
MAX_METRIC_PATTERNS = 32  # AssignJob.metrics
MAX_METRIC_REGEX_CHARS = 500
# A training metric's name: letters, digits, "_", ".", "/", "-", starting
# with a letter or "_" (wandb's and TensorBoard's names, "train/loss", fit).
METRIC_NAME_PATTERN = r"^[A-Za-z_][A-Za-z0-9_./-]{0,63}$"


def _cut_to(limit: int) -> BeforeValidator:
    return BeforeValidator(lambda value: value[:limit] if isinstance(value, str) else value)


Reason = Annotated[str, _cut_to(MAX_REASON_CHARS)]  # cut, never refused
Name = Annotated[str, _cut_to(MAX_NAME_CHARS)]  # cut, never refused
Id = Annotated[str, Field(max_length=MAX_ID_CHARS)]  # longer: a bad frame


class _Message(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Resources(_Message):
    cpus: int = Field(ge=1)
    memory_bytes: int = Field(ge=0)
    disk_bytes: int = Field(ge=0)
    gpus: list[Gpu] = Field(default_factory=list, max_length=MAX_GPUS)


class Gpu(_Message):
    name: Name
    memory_bytes: int = Field(ge=0)


# ---------------------------------------------------------------- runner → server


class CloudIdentity(_Message):
    """Where the runner runs, when it can tell (instance metadata). On EC2
    also the instance identity document and its RSA-2048 signature (base64
    PKCS#7) as the metadata service serves them: the server checks them
    against the machine it launched, and refuses a hello from one of its
    EC2 machines without them (docs/RUNNER.md, "Machine identity")."""

    instance_id: Name = ""
    instance_type: Name = ""
    region: Name = ""
    zone: Name = ""
    document: str = Field(default="", max_length=MAX_IDENTITY_CHARS)
    signature: str = Field(default="", max_length=MAX_IDENTITY_CHARS)


class HeldJob(_Message):
    """A job attempt the runner holds across a reconnect. ``confirmed``: its
    commands were allowed to start; otherwise it waits for the server's
    confirmation of its acceptance."""

    job: Id
    attempt: int = Field(ge=1)
    lease: Id
    confirmed: bool
    ports: list[int] = Field(default_factory=list, max_length=MAX_PORTS)  # as in its JobAccepted


class Hello(_Message):
    """First frame after connecting. ``running_jobs`` lists the attempts the
    runner still holds from before a reconnect, so the server does not
    re-queue them. ``address`` is where other jobs of a run reach this
    machine's jobs (``--address``; the local backend uses 127.0.0.1)."""

    type: Literal["hello"] = "hello"
    protocol: int = PROTOCOL_VERSION
    version: Name
    hostname: Name
    address: Name = ""
    resources: Resources
    running_jobs: list[HeldJob] = Field(default_factory=list, max_length=MAX_HELD_JOBS)
    cloud: CloudIdentity | None = None
    # The sessions this runner serves (``OpenRelay``): RELAY_VERSION, or 0
    # for none; and its SSH host key (one OpenSSH public key line), which
    # clients pin for the job's ``ssh`` sessions.
    relay: int = Field(default=0, ge=0, le=1000)
    ssh_host_key: str = Field(default="", max_length=MAX_HOST_KEY_CHARS)


class JobAccepted(_Message):
    """The runner takes an assigned attempt; must arrive before the lease
    ends. It runs nothing until ``JobConfirmed``."""

    type: Literal["job_accepted"] = "job_accepted"
    job: Id
    attempt: int = Field(ge=1)
    lease: Id
    # The free ports the runner picked for an ``AssignJob.port_count`` (the
    # job's PORT_0…), so the server can show them and give them to the jobs
    # that run after this one (``TRAINYARD_MASTER_PORT``).
    ports: list[int] = Field(default_factory=list, max_length=MAX_PORTS)


class JobRejected(_Message):
    type: Literal["job_rejected"] = "job_rejected"
    job: Id
    attempt: int = Field(ge=1)
    lease: Id
    reason: Annotated[str, _cut_to(MAX_REJECTION_CHARS)]


class EnvironmentReport(_Message):
    """The environment a job's commands run in (``AssignJob.environment``,
    docs/ENVIRONMENTS.md): sent with ``running`` and with the final state.
    ``lock``: the resolved requirements with versions and hashes;
    ``packages``: what was installed after the setup commands."""

    key: str = Field(pattern=r"^[0-9a-f]{24}$")
    built: bool  # this attempt built it (False: it was reused)
    build_seconds: float = Field(ge=0, allow_inf_nan=False)
    size_bytes: int = Field(ge=0)
    lock: str = Field(max_length=2_000_000)
    packages: str = Field(max_length=2_000_000)
    platform: dict[Annotated[str, Field(max_length=MAX_NAME_CHARS)], Name] = Field(
        default_factory=dict, max_length=MAX_PLATFORM_FACTS
    )
    # The key without the platform: sha256 of the spec and its files' digests.
    recipe: str = Field(default="", pattern=r"^([0-9a-f]{64})?$")


class JobState(_Message):
    """A job changed state on the runner.

    ``running``: the commands started. ``succeeded``/``failed``: the commands
    ended (``exit_code`` set) and every log line has been acknowledged and
    every artifact uploaded. ``stopped``: ended by a ``CancelJob``.
    ``failed`` with ``exit_code`` None means the runner could not run the job
    (clone failed, artifact upload failed, …); ``reason`` says why.
    ``interrupted``: the machine is being reclaimed (a spot interruption
    notice, ``interrupt_at`` the unix time the cloud takes it). Sent at the
    notice, while the job still gets SIGTERM, writes its checkpoint and is
    synced: the server ends the attempt at once and starts another one
    elsewhere; nothing more of this attempt is stored after it. Also the
    final state of such a job (which the server then refuses).
    Also: the job's checkpoint could not be restored before its commands
    started (``reason`` says why); retried like an interruption, not counted
    as the job's error.

    A final state also names ``log_lines``, how many lines the attempt shipped
    (seqs ``seq_base + 1`` … ``seq_base + log_lines``), and ``log_digest``
    over them (``log_digest_add``): the server compares both with what it
    received and flags the job when they differ. Older runners send neither;
    their logs are not checked.
    """

    type: Literal["job_state"] = "job_state"
    job: Id
    attempt: int = Field(ge=1)
    state: Literal["preparing", "running", "uploading", "succeeded", "failed", "stopped", "interrupted"]
    exit_code: int | None = None
    reason: Reason = ""
    interrupt_at: float | None = None
    log_lines: int | None = Field(default=None, ge=0)
    log_digest: str = Field(default="", pattern=r"^([0-9a-f]{16})?$")
    # The job's environment, once it is ready (``running`` and final states).
    environment: EnvironmentReport | None = None
    # ``failed`` because its artifacts could not be uploaded: the unix time
    # its files are kept on the machine until (runner/kept.py), else None.
    kept_until: float | None = Field(default=None, ge=0, allow_inf_nan=False)


class Logs(_Message):
    """A batch of consecutive lines of one job, seqs ``first_seq`` ..
    ``first_seq + len(streams) - 1``, in the form the server stores:
    ``text`` is the lines, each followed by ``"\\n"`` (a line holds no other
    ``"\\n"``); ``streams`` one letter per line, ``o`` (stdout) or ``e``
    (stderr); ``times`` runs of ``[lines, unix time]`` in order, one per read
    of the output (the lines of one read share a time). The server checks
    the shape with a few C-speed string calls, stores the text as it is and
    fans the same fields out to followers: nothing is done per line."""

    type: Literal["logs"] = "logs"
    job: Id
    attempt: int = Field(ge=1)
    first_seq: int = Field(ge=1)
    streams: str = Field(min_length=1, max_length=MAX_FRAME_LINES)
    times: list[tuple[Annotated[int, Field(ge=1)], LogTime]] = Field(min_length=1, max_length=MAX_FRAME_LINES)
    # Bounded in ``_shape``, not by a field constraint: a constrained str is
    # validated on another path, which refuses the lone surrogates that carry
    # a job's undecodable bytes.
    text: str

    @model_validator(mode="after")
    def _shape(self) -> Logs:
        count = len(self.streams)
        if len(self.text) > MAX_LOG_TEXT_CHARS:
            raise ValueError(f"text: at most {MAX_LOG_TEXT_CHARS} characters")
        if self.streams.strip("oe"):
            raise ValueError("streams: one letter per line, o or e")
        if self.text.count("\n") != count or not self.text.endswith("\n"):
            raise ValueError(f"text: {count} lines, each ended by a newline")
        if sum(n for n, _ in self.times) != count:
            raise ValueError(f"times: runs covering {count} lines")
        return self

    @classmethod
    def of(cls, *, job: str, attempt: int, first_seq: int, lines: Sequence[LogLineWire]) -> Logs:
        """The frame of ``lines`` ([time, stream, text] each; texts without "\\n")."""
        streams, times, text = chunk_fields(lines)
        return cls(job=job, attempt=attempt, first_seq=first_seq, streams=streams, times=times, text=text)


def chunk_fields(lines: Sequence[tuple[float, str, str]]) -> tuple[str, list[tuple[int, float]], str]:
    """``streams``, ``times`` and ``text`` of a ``Logs`` frame holding ``lines``."""
    streams = "".join(map(itemgetter(1), lines))
    times = [(len(list(run)), ts) for ts, run in groupby(lines, itemgetter(0))]
    return streams, times, chunk_text(list(map(itemgetter(2), lines)))


def chunk_text(texts: Sequence[str]) -> str:
    """Every one of ``texts`` followed by "\n"; a "\n" inside a text, which a
    runner never reads, is kept as NEWLINE_STANDIN."""
    if not texts:
        return ""
    text = "\n".join(texts) + "\n"
    if text.count("\n") != len(texts):
        text = "\n".join([t.replace("\n", NEWLINE_STANDIN) for t in texts]) + "\n"
    return text


def chunk_times(times: Iterable[tuple[int, float]]) -> list[float]:
    """One time per line of ``times``' runs."""
    out: list[float] = []
    for count, ts in times:
        out += [ts] * count
    return out


def chunk_lines(streams: str, times: Iterable[tuple[int, float]], text: str) -> list[LogLineWire]:
    return list(zip(chunk_times(times), streams, text.split("\n")[:-1], strict=True))  # type: ignore[arg-type]


MAX_DATA_INPUTS = 32  # a workflow's ``inputs:`` items
MAX_VOLUMES = 8  # a workflow's ``volumes:`` items
MAX_DATA_CACHED = 256  # Heartbeat.data_cached entries
DATA_IDENTITY_PATTERN = r"^[0-9a-f]{64}$"


class Heartbeat(_Message):
    """Every ``Welcome.heartbeat_seconds``. ``kept_until``: the latest unix
    time until which the machine keeps a job's files whose upload failed
    (None: it keeps none); the server does not retire the idle machine
    before then (at most ``MAX_KEPT_SECONDS`` from when it hears it).
    ``app_idle_seconds``: how long ago the running job's Jupyter (a dev
    environment) last saw activity, a kernel busy now being activity now
    (None: no such job, or not asked yet); a duration, so no clock of the
    machine's is compared with the server's."""

    type: Literal["heartbeat"] = "heartbeat"
    state: Literal["idle", "busy"]
    kept_until: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    app_idle_seconds: float | None = Field(default=None, ge=0, le=365 * 86400, allow_inf_nan=False)
    # The ``DataInput.snapshot``s whose every file this machine's cache holds
    # (the newest ``MAX_DATA_CACHED``): ``--dry-run`` says an input is cached there.
    data_cached: list[Annotated[str, Field(pattern=DATA_IDENTITY_PATTERN)]] = Field(
        default_factory=list, max_length=MAX_DATA_CACHED
    )


# ---------------------------------------------------------------- metrics

# The series the server keeps of a job's ``SystemSample``s, by name; a
# training metric may not take one of these names (docs/METRICS.md).
SYSTEM_METRICS = ("cpu", "memory", "disk_used", "disk_total", "net_rx", "net_tx")
GPU_METRICS = ("util", "memory", "memory_total", "power", "temperature")  # as "gpu<index>.<metric>"
SYSTEM_METRIC_PATTERN = r"^(cpu|memory|disk_used|disk_total|net_rx|net_tx|gpu[0-9]+\.[a-z_]+)$"

MetricValue = Annotated[float, Field(allow_inf_nan=False)]
Percent = Annotated[float, Field(ge=0, le=100_000, allow_inf_nan=False)]  # of one core: 250 is 2.5 cores
Bytes = Annotated[int, Field(ge=0)]


class GpuSample(_Message):
    """One GPU at one sample: ``util`` in percent, memory in bytes, power in
    watts and temperature in °C (None where the driver does not say)."""

    index: int = Field(ge=0, lt=MAX_GPUS)
    util: float = Field(ge=0, le=100, allow_inf_nan=False)
    mem_used: Bytes
    mem_total: Bytes
    power_w: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    temp_c: float | None = Field(default=None, allow_inf_nan=False)


class SystemSample(_Message):
    """The job at unix time ``t``: ``cpu`` (percent of one core, its whole
    process tree), ``rss`` (bytes resident, its process tree), the job's
    working directory's filesystem (``disk_used``/``disk_total``, bytes),
    the machine's network (``net_rx``/``net_tx``, bytes per second since the
    previous sample) and each GPU."""

    t: LogTime
    cpu: Percent
    rss: Bytes
    disk_used: Bytes = 0
    disk_total: Bytes = 0
    net_rx: float = Field(default=0, ge=0, allow_inf_nan=False)
    net_tx: float = Field(default=0, ge=0, allow_inf_nan=False)
    gpus: list[GpuSample] = Field(default_factory=list, max_length=MAX_GPUS)


class TrainingValue(_Message):
    """One value of a training metric: matched in a log line by one of
    ``AssignJob.metrics`` (``source`` "log") or read from a JSON line of the
    job's ``$TRAINYARD_METRICS_FILE`` (``source`` "file"). ``step`` keys the
    curve where the job gave one (None: keyed by ``t``)."""

    name: str = Field(pattern=METRIC_NAME_PATTERN)
    value: MetricValue
    step: int | None = Field(default=None, ge=0)
    t: LogTime
    source: Literal["log", "file"]


class Metrics(_Message):
    """A batch of one attempt's metrics, every few seconds while it runs and
    once at its end. Not acknowledged: the runner keeps what it could not
    send while the server was away (up to the bounds) and sends it after the
    reconnect; the server keeps a system sample only if it is later than the
    attempt's last one, and a training value only if its (name, step or t)
    is new for the attempt. ``dropped``: training values over the job's
    per-minute cap since the previous frame; ``malformed``: lines of the
    metrics file that were not a JSON object of numbers, skipped."""

    type: Literal["metrics"] = "metrics"
    job: Id
    attempt: int = Field(ge=1)
    system: list[SystemSample] = Field(default_factory=list, max_length=MAX_SYSTEM_SAMPLES)
    training: list[TrainingValue] = Field(default_factory=list, max_length=MAX_TRAINING_VALUES)
    dropped: int = Field(default=0, ge=0)
    malformed: int = Field(default=0, ge=0)


RunnerMessage = Annotated[
    Hello | JobAccepted | JobRejected | JobState | Logs | Heartbeat | Metrics,
    Field(discriminator="type"),
]
runner_message = TypeAdapter(RunnerMessage)


# ---------------------------------------------------------------- server → runner


class ArtifactSpec(_Message):
    path: str  # relative to the job's working directory, e.g. "./base_model"
    # ``mount: true`` (dstack 0.x): also uploaded while the job runs, every
    # ``AssignJob.mount_seconds`` when something in it changed, so it can be
    # browsed before the job ends; each upload replaces the last.
    mount: bool = False


class GitCredential(_Message):
    """How git authenticates to a private repository: ``https-token`` (HTTP
    Basic, ``username`` and the token as ``secret``) or ``ssh-key`` (a private
    key as ``secret``). Used for the clone and fetches of this job only: never
    logged, never written to disk but as a 0600 key file while git runs.
    Comes in ``JobSecrets`` (REST), never in an ``AssignJob``."""

    kind: Literal["https-token", "ssh-key"]
    username: str = ""
    secret: str = Field(repr=False, min_length=1)


class CodeSpec(_Message):
    """Where the job's code comes from: a git remote at a commit plus an
    optional binary patch (``git apply``), or an archive (tar.gz) to download."""

    kind: Literal["git", "archive"]
    repo_url: str = ""
    commit: str = ""
    patch_url: str = ""  # signed GET url; empty when there is no patch
    archive_url: str = ""  # signed GET url; kind == "archive"
    # The repository's, when one is set (kind == "git"): never sent by the
    # server; the runner fills it in from ``JobSecrets.credential``.
    credential: GitCredential | None = None


class InputFile(_Message):
    path: str  # relative to the artifact path
    size: int
    sha256: str
    url: str  # signed GET url


class InputArtifact(_Message):
    """An artifact of another job, placed at ``path`` (relative to the
    working directory, e.g. "./base_model") before the commands run.
    The server sends ``file_count`` and no ``files``; the runner reads
    them from ``GET …/runner/jobs/<job>/inputs/?path=<path>`` page by page
    (``InputPage``) and fills ``files`` in."""

    path: str
    file_count: int = Field(default=0, ge=0)
    files: list[InputFile] = Field(default_factory=list)


class InputPage(_Message):
    """One page of an input's files (REST, not a websocket frame): ``next``
    is the ``after`` of the next page, "" after the last one."""

    path: str
    files: list[InputFile]
    next: str = ""


class DataFile(_Message):
    """One object of a data input (docs/DATA.md). ``url``: where to GET it
    (a presigned S3 URL pinned to the listed version where the bucket keeps
    versions; the ``https://`` input's own URL). ``etag``: the ETag the
    listing saw, quotes stripped ("" unknown): a response with another ETag is
    a changed object, never written into place. ``sha256``: its content's
    digest where the server knows it (an ``https://`` input's ``sha256:``
    pin; "" for S3 objects, whose listing carries no checksum), checked
    before the file is used.
    ``identity``: a digest of the workspace, source, bucket, key and
    version/ETag/size: the machine's cache keeps the bytes under it."""

    path: str  # relative to the input's path; "" for a single-file input placed at the path itself
    size: int = Field(ge=0)
    url: str
    etag: str = ""
    sha256: str = ""
    identity: str = Field(pattern=DATA_IDENTITY_PATTERN)


class DataInput(_Message):
    """A workflow's ``inputs:`` item from outside Trainyard (``s3://…``,
    ``https://…``), as the server listed it when the run was submitted,
    placed at ``path`` (relative to the working directory) before the
    commands run, complete or not at all. The server sends ``file_count``,
    ``total_size`` and no ``files``; the runner reads them from ``GET
    …/runner/jobs/<job>/data/?path=<path>&after=<next>`` page by page
    (``DataPage``). ``snapshot``: the listing's digest; a machine that holds
    every file of it says so in ``Heartbeat.data_cached``."""

    uri: str
    path: str
    snapshot: str = Field(pattern=DATA_IDENTITY_PATTERN)
    file_count: int = Field(ge=0)
    total_size: int = Field(ge=0)
    read_only: bool = True
    files: list[DataFile] = Field(default_factory=list)


class DataPage(_Message):
    """One page of a data input's files (REST): ``next`` is the ``after`` of
    the next page, "" after the last one."""

    path: str
    files: list[DataFile]
    next: str = ""


class VolumeMount(_Message):
    """A workflow's ``volumes:`` item: the workspace's volume ``name``,
    mounted at ``path`` (an absolute path, or relative to the working
    directory) for the job. ``kind`` "ebs": the server attached the EBS
    volume ``volume_id`` to this machine before assigning the job; the runner
    finds its block device, makes a filesystem on it when it has none
    (``fresh``) and mounts it. ``kind`` "directory": a folder of the machine
    (local and self-hosted machines), ``<work dir>/volumes/<volume_id>``."""

    name: str
    volume_id: str
    kind: Literal["ebs", "directory"]
    path: str
    device: str = ""  # the device name the server attached it as ("/dev/sdf"); "" for a directory
    read_only: bool = False


class JobSecrets(_Message):
    """The job's secrets (REST ``GET …/runner/jobs/<job>/secrets/``, not a
    websocket frame): the workspace's secrets as environment variables (the
    assignment's ``env`` wins over them) and the repository's clone
    credential. Kept in memory only, never in ``job.json``."""

    env: dict[str, str] = Field(default_factory=dict, repr=False)
    credential: GitCredential | None = None


class CheckpointSpec(_Message):
    """Where the job keeps its checkpoint, synced by the runner: every
    ``sync_seconds`` when something changed, when asked
    (``Job.sync_checkpoint``: an interruption notice, a rebalance
    recommendation) and when the commands end. ``version`` > 0: the job's
    latest checkpoint version, whose ``files`` the runner restores at
    ``path`` before the commands start (an attempt after an interruption)."""

    path: str  # relative to the working directory
    sync_seconds: float = 300.0
    version: int = Field(default=0, ge=0)  # 0: nothing to restore
    files: list[InputFile] = Field(default_factory=list)  # relative to ``path``


class CacheSpec(_Message):
    """A workflow's ``cache:`` path (dstack 0.x): ``~/.cache/pip`` (``~`` is
    the job's home), an absolute path, or one relative to the working
    directory. ``files``: the workspace's latest saving of it for this
    workflow, restored before the commands start; the runner saves the path
    again after the commands succeed."""

    path: str
    files: list[InputFile] = Field(default_factory=list)


class EnvironmentSpec(_Message):
    """A job's ``environment:`` (docs/ENVIRONMENTS.md): a Python virtual
    environment the runner builds once per key and reuses. ``python``: the
    version (``"3.11"``), "" for the machine's ``python3``; ``requirements``:
    a file of the checkout; ``pip``: requirement lines; ``setup``: bash
    commands run in the new environment, in the checkout, once per build.
    ``lock``: a re-run's recorded lock: installed as it is, nothing resolved."""

    python: str = ""
    requirements: str = ""
    pip: list[str] = Field(default_factory=list)
    setup: list[str] = Field(default_factory=list)
    lock: str = Field(default="", max_length=2_000_000)


class MetricPattern(_Message):
    """A training metric read off the job's log lines: ``regex`` (Python's
    ``re``) is searched in every line; its group ``value`` (or its first
    group) is the value, its group ``step``, where it has one, the step."""

    name: str = Field(pattern=METRIC_NAME_PATTERN)
    regex: str = Field(min_length=1, max_length=MAX_METRIC_REGEX_CHARS)


class AssignJob(_Message):
    """An attempt of a job for the runner. It must answer ``JobAccepted`` with
    the same lease within ``lease_seconds`` or the server takes the job back.
    The attempt's log lines are numbered from ``seq_base + 1``."""

    type: Literal["assign_job"] = "assign_job"
    job: str
    attempt: int = Field(ge=1)
    seq_base: int = Field(ge=0)
    lease: str
    lease_seconds: float
    run_name: str
    workflow: str
    commands: list[str]
    env: dict[str, str]  # no secret: see ``secrets``
    code: CodeSpec
    artifacts: list[ArtifactSpec]
    # Base URL of the REST API for artifact uploads (runner token auth).
    api_url: str
    inputs: list[InputArtifact] = Field(default_factory=list)
    # "bash" and "python" run the commands under bash on the machine;
    # "docker" runs them in ``image`` (the machine needs a Docker engine).
    provider: str = "bash"
    image: str = ""
    checkpoint: CheckpointSpec | None = None
    # ``ports: N`` in the workflow: the runner picks N free ports on the
    # machine, gives them to the job as PORT_0 … PORT_{N-1} and names them in
    # its ``JobAccepted``.
    port_count: int = Field(default=0, ge=0, le=64)
    mount_seconds: float = Field(default=10.0, gt=0)
    caches: list[CacheSpec] = Field(default_factory=list)
    # Built (or reused) before the commands start; they run with it activated.
    environment: EnvironmentSpec | None = None
    # The job has secrets or a clone credential: the runner GETs ``JobSecrets``
    # before preparing (a refusal, e.g. a secret no key opens, fails the job).
    secrets: bool = False
    # ``on_server_lost: keep-running``: the runner keeps the job running when
    # it has lost the server for longer than the unreachable grace.
    keep_running_server_lost: bool = False
    # This attempt's own credential: every call the runner makes for the job
    # (secrets, inputs, URLs, artifacts, checkpoints, caches, environments)
    # sends ``<runner token>.<job_token>``; the server refuses the runner's
    # token alone for an attempt that has one, and the pair once the attempt
    # has ended. "": a server that mints none.
    job_token: str = ""
    # Training metrics from the log (docs/METRICS.md); system samples every
    # ``metrics_interval`` seconds; at most ``metrics_per_minute`` training
    # values a minute (the rest are counted in ``Metrics.dropped``).
    metrics: list[MetricPattern] = Field(default_factory=list, max_length=MAX_METRIC_PATTERNS)
    metrics_interval: float = Field(default=5.0, ge=1, le=3600)
    metrics_per_minute: int = Field(default=600, ge=1, le=100_000)
    # Inputs from the user's buckets and URLs (docs/DATA.md), and volumes.
    data: list[DataInput] = Field(default_factory=list, max_length=MAX_DATA_INPUTS)
    volumes: list[VolumeMount] = Field(default_factory=list, max_length=MAX_VOLUMES)


class JobConfirmed(_Message):
    """The server recorded the acceptance: the runner may start the commands."""

    type: Literal["job_confirmed"] = "job_confirmed"
    job: str
    attempt: int


# The longest a stop may give the commands to write their checkpoint.
MAX_CANCEL_GRACE = 120.0


class CancelJob(_Message):
    """Stop the job: SIGTERM, SIGKILL after the grace, then its checkpoint is
    synced and the final state (``stopped``) sent. ``grace`` > 0 (the
    budget's stop): the stop is announced as a spot notice is, in the job's
    interrupt file (``TRAINYARD_INTERRUPT_ACTION=stop``, the time of the
    SIGKILL), and the commands get that long to write their checkpoint;
    0: the runner's own short grace (``Job.CANCEL_GRACE``)."""

    type: Literal["cancel_job"] = "cancel_job"
    job: str
    attempt: int = 0  # 0: whichever attempt the runner holds
    reason: str = ""
    grace: float = Field(default=0.0, ge=0.0, le=MAX_CANCEL_GRACE)


class Refused(_Message):
    """A frame about ``job``/``attempt`` was not accepted: that attempt is not
    the job's current one on this runner (it was moved, stopped or fenced).
    The runner stops the attempt and drops what it still had to send for it."""

    type: Literal["refused"] = "refused"
    job: str
    attempt: int
    reason: str


class LogAck(_Message):
    type: Literal["log_ack"] = "log_ack"
    job: str
    seq: int  # highest seq stored for the job


class Welcome(_Message):
    """Answer to Hello. ``acked`` gives, for every job in ``running_jobs``,
    the highest stored seq, so the runner resends exactly what is missing."""

    type: Literal["welcome"] = "welcome"
    protocol: int = PROTOCOL_VERSION
    instance: str
    heartbeat_seconds: float
    acked: dict[str, int] = Field(default_factory=dict)
    # Held jobs being stopped: stop them and report (their last lines are still wanted).
    cancel: list[str] = Field(default_factory=list)
    # Held attempts the server no longer listens to (moved, ended, fenced): drop them.
    refused: list[str] = Field(default_factory=list)
    # Held jobs whose acceptance is confirmed: their commands may run.
    confirmed: list[str] = Field(default_factory=list)
    # Set only when the runner said hello with its machine's single-use
    # bootstrap token: its own token from now on (the runner saves it and
    # uses it for every later connection and REST call).
    token: str = Field(default="", repr=False)
    # After this long without the server, the server fences this runner and
    # runs its jobs again elsewhere: the runner stops them first (but those
    # of workflows with ``on_server_lost: keep-running``). None: never.
    unreachable_grace_seconds: float | None = Field(default=None, gt=0)
    # The origin of the server's REST API (its public URL's): said here, on
    # the runner's own connection, so no frame that crossed the channel layer
    # can move where the runner sends its token. "": the origin it connected to.
    api_origin: str = Field(default="", max_length=MAX_NAME_CHARS)


class Shutdown(_Message):
    """The server retires this runner (idle timeout): finish and exit 0."""

    type: Literal["shutdown"] = "shutdown"
    reason: str = ""


# Sessions into a running job (docs/ACCESS.md). The runner serves one by
# dialling out a websocket of its own per session, never on this one, so a
# session's bytes cannot delay the log stream:
#   GET /ws/runner/relay/<session>/ with ``Authorization: Bearer <runner token>``
#   and ``RELAY_KEY_HEADER: <relay_key>``.
# On it, binary frames are the session's bytes (at most MAX_RELAY_FRAME
# each) and text frames JSON control messages: ``{"type": "resize", "cols",
# "rows"}`` and ``{"type": "end", "reason"}`` from the server,
# ``{"type": "end", "reason"}`` from the runner.
RELAY_VERSION = 1
RELAY_KEY_HEADER = "X-Trainyard-Relay-Key"
MAX_RELAY_FRAME = 256 << 10
MAX_SESSION_KEYS = 32


class OpenRelay(_Message):
    """Serve session ``session`` into ``job``: dial the relay websocket with
    ``relay_key`` and hand its bytes to a handler of ``kind``: ``port``
    (connect to 127.0.0.1:``port``), ``ssh`` (an SSH server accepting
    ``keys``, the grantee's OpenSSH public keys) or ``terminal`` (a shell on
    a PTY)."""

    type: Literal["open_relay"] = "open_relay"
    session: str
    job: str
    kind: Literal["ssh", "terminal", "port"]
    port: int | None = Field(default=None, ge=1, le=65535)
    keys: list[str] = Field(default_factory=list, max_length=MAX_SESSION_KEYS)
    relay_key: str = Field(repr=False)


class CloseRelay(_Message):
    """End session ``session`` if the runner still serves it."""

    type: Literal["close_relay"] = "close_relay"
    session: str
    reason: str = ""


ServerMessage = Annotated[
    AssignJob | JobConfirmed | CancelJob | Refused | LogAck | Welcome | Shutdown | OpenRelay | CloseRelay,
    Field(discriminator="type"),
]
server_message = TypeAdapter(ServerMessage)

# Close codes the server uses; the runner treats 4401/4403/4409 as fatal.
CLOSE_UNAUTHORIZED = 4401
CLOSE_FORBIDDEN = 4403
CLOSE_BAD_MESSAGE = 4400
CLOSE_FLOODING = 1008  # policy violation: log frames sent without waiting for acks
CLOSE_VERSION_MISMATCH = 4409  # the close reason says which side to upgrade
CLOSE_REPLACED = 4410  # a newer connection of the same runner took over
CLOSE_FENCED = 4411  # the instance was declared lost: its runner must stop and exit
# Another connection with this runner's token is live (heartbeating): this one
# is refused and nothing changes. Not fatal: a runner back from a network blip
# retries until its old connection has been silent past the liveness window.
CLOSE_IN_USE = 4412
CLOSE_RATE_LIMITED = 4429  # too many connects: retry after the wait the close reason names (not fatal)

Resources.model_rebuild()
