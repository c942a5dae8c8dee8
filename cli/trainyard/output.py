"""Terminal output: the log writer, the run status display, tables, the
views of a run of several jobs (``--dry-run``'s plan, ``show``'s DAG) and the
little formatters (ages, durations, sizes, resources).

Job log lines go through ``LogWriter`` (plain buffered writes, never rich:
a job can print 100,000 lines a second). The CLI's own messages go to
stderr, so a job's stdout can be piped or redirected untouched.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from datetime import UTC, datetime
from decimal import ROUND_HALF_UP, Decimal
from typing import Any, TextIO

from rich.console import Console
from rich.status import Status
from rich.table import Table
from rich.text import Text

REASON_WIDTH = 48


class LogWriter:
    """Writes ``(stream, text)`` lines: ``"e"`` to stderr, the rest to stdout.

    One write per run of same-stream lines, and the other stream is flushed
    before switching, so stdout and stderr interleave in order on a terminal.
    """

    def __init__(self, out: TextIO | None = None, err: TextIO | None = None) -> None:
        self.out = out or sys.stdout
        self.err = err or sys.stderr

    def write(self, lines: Iterable[tuple[str, str]]) -> None:
        current = ""
        chunk: list[str] = []
        for stream, text in lines:
            if stream != current:
                self._emit(current, chunk)
                current, chunk = stream, []
            chunk.append(text)
        self._emit(current, chunk)
        self.out.flush()
        self.err.flush()

    def _emit(self, stream: str, chunk: list[str]) -> None:
        if not chunk:
            return
        target, other = (self.err, self.out) if stream == "e" else (self.out, self.err)
        other.flush()
        target.write("\n".join(chunk) + "\n")


def line_stamp(ts: float | None) -> str:
    """``2026-12-02T12:00:00.123456Z `` (UTC, microseconds, then a space): a
    log line's time as the server's raw read-back writes it ("" unknown)."""
    if ts is None:
        return ""
    second, micro = divmod(round(ts * 1_000_000), 1_000_000)
    return f"{time.strftime('%Y-%m-%dT%H:%M:%S', time.gmtime(second))}.{micro:06d}Z "


class StatusDisplay:
    """Shows a run's status on stderr.

    Live (a terminal): a spinner with the reason while the run waits for a
    machine, one line per other status change. Plain (piped): one line
    ``[status] reason`` per change of status or reason.
    """

    def __init__(self, *, live: bool, err: TextIO | None = None) -> None:
        self.live = live
        self.err = err or sys.stderr
        self._console = Console(file=self.err, stderr=err is None, highlight=False)
        self._spinner: Status | None = None
        self._last: tuple[str, str] | None = None

    def update(self, run: Mapping[str, Any]) -> None:
        status, reason = run_status(run)
        if (status, reason) == self._last:
            return
        self._last = (status, reason)
        text = f"[{status}] {reason}".rstrip()
        if self.live and waiting(run):
            self._spin(text)
            return
        self.pause()
        self.err.write(text + "\n")
        self.err.flush()

    def pause(self) -> None:
        """Stop the spinner (before log lines are written)."""
        if self._spinner is not None:
            self._spinner.stop()
            self._spinner = None

    def _spin(self, text: str) -> None:
        if self._spinner is None:
            self._spinner = Status(Text(text), console=self._console)
            self._spinner.start()
        else:
            self._spinner.update(Text(text))


def waiting(run: Mapping[str, Any]) -> bool:
    """Whether the run waits for a machine (pending, or every job not started)."""
    jobs = run.get("jobs") or []
    return run.get("status") == "pending" or (
        run.get("status") == "running" and bool(jobs) and all(j.get("status") in ("pending", "assigned") for j in jobs)
    )


def run_status(run: Mapping[str, Any]) -> tuple[str, str]:
    """(status, reason) to show; the first job's reason if the run has none."""
    reason = run.get("status_reason") or next(
        (j.get("status_reason") for j in run.get("jobs") or [] if j.get("status_reason")), ""
    )
    return str(run.get("status", "?")), str(reason or "")


def rich_table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> Table:
    """The table ``print_table`` shows on a terminal (and ``ps --watch`` redraws)."""
    table = Table(box=None, header_style="bold", pad_edge=False)
    for header in headers:
        table.add_column(header, overflow="fold")
    for row in rows:
        table.add_row(*(Text(cell) for cell in row))
    return table


def print_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, tty: bool, out: TextIO | None = None) -> None:
    """A rich table on a terminal, plain aligned columns when piped."""
    out = out or sys.stdout
    if tty:
        Console(file=out, highlight=False).print(rich_table(headers, rows))
        return
    widths = [max(len(str(c)) for c in col) for col in zip(headers, *rows, strict=False)]
    for row in [headers, *rows]:
        out.write("  ".join(str(c).ljust(w) for c, w in zip(row, widths, strict=False)).rstrip() + "\n")


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def age(value: str | None, *, now: datetime | None = None) -> str:
    """``3m ago`` for an ISO timestamp; ``-`` if missing."""
    then = parse_time(value)
    if then is None:
        return "-"
    seconds = max(0, int(((now or datetime.now(UTC)) - then).total_seconds()))
    if seconds < 5:
        return "just now"
    return f"{_span(seconds, parts=1)} ago"


def money(amount: str | None) -> str:
    """``$12.35`` for the API's decimal USD string, ``<$0.01`` below a cent
    (but not nothing), ``-`` if unknown; rounded here, only for display."""
    if amount is None:
        return "-"
    value = Decimal(amount)
    if 0 < value < Decimal("0.01"):
        return "<$0.01"
    return f"${value.quantize(Decimal('0.01'), rounding=ROUND_HALF_UP):,}"


def cost_lines(run: Mapping[str, Any]) -> list[str]:
    """``trainyard show``'s costs: each job's, then each of its attempts' as
    its machine's price x the time it held it."""
    lines = []
    for job in run.get("jobs") or []:
        if job.get("cost") is None:
            continue
        lines.append(f"  {job['name']}: {money(job['cost'])}")
        for a in job.get("attempts") or []:
            if a.get("cost") is None:
                continue
            price = Decimal(a["price_per_hour"]).normalize()
            held = duration(a.get("billed_seconds"))
            lines.append(
                f"    attempt {a['number']}: {money(a['cost'])} = ${price:f}/h x {held} on {a.get('instance') or '-'}"
            )
    return lines


def duration(seconds: float | None) -> str:
    """``1m 5s`` for a number of seconds; ``-`` if unknown."""
    return "-" if seconds is None else _span(int(seconds), parts=2)


def size(n: int | None) -> str:
    """``1.5 MiB``-style human size."""
    if n is None:
        return "-"
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def truncate(text: str, width: int = REASON_WIDTH) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


def _span(seconds: int, *, parts: int) -> str:
    units = (("d", 86400), ("h", 3600), ("m", 60), ("s", 1))
    out: list[str] = []
    for name, length in units:
        if seconds >= length or (name == "s" and not out):
            out.append(f"{seconds // length}{name}")
            seconds %= length
        if len(out) == parts:
            break
    return " ".join(out)


# ---------------------------------------------------------------- runs of several jobs


def plan_lines(plan: Mapping[str, Any]) -> list[str]:
    """A run plan (``Client.plan_run``) as text: jobs in order, what each
    waits for, its inputs, resources, and either its cache hit or its commands."""
    jobs = plan.get("jobs") or []
    cached = sum(1 for job in jobs if job.get("cache"))
    counts = f"{len(jobs)} job{'s' * (len(jobs) != 1)}" + (f", {cached} cached" if cached else "")
    out = [f"Plan for {plan.get('workflow')}: {counts}"]
    if plan.get("help"):
        out.append(f"  {plan['help']}")
    if (estimate := estimate_words(plan)) is not None:
        out.append(f"  {estimate}")
    for number, job in enumerate(jobs, 1):
        out += ["", f"{number}. {job['name']} ({job.get('provider', '?')})"]
        waits = _waits(job)
        if waits:
            out.append(f"   needs: {waits}")
        out += [f"   input: {i['path']} from {i['from']}" for i in job.get("inputs") or []]
        out += [f"   data: {data_words(d)}" for d in job.get("data_inputs") or []]
        out += [f"   volume: {planned_volume_words(v)}" for v in job.get("volumes") or []]
        out.append(f"   resources: {resources(job.get('resources') or {})}")
        if job.get("offer"):
            out.append(f"   offer: {offer_words(job['offer'])}")
        if "max_cost" in job:
            out.append(f"   max cost: {max_cost_words(job['max_cost'])}")
        out += [f"   guard: {words}" for words in job.get("guards") or []]
        cache = job.get("cache")
        decision = (job.get("cache_decision") or {}).get("text")
        if decision or cache:  # a server older than cache decisions sends only the hit
            out.append(f"   cache: {decision or reused_words(cache['run'])}")
        if not cache:
            if job.get("environment"):
                out.append(f"   environment: {environment_words(job['environment'])}")
            out += ["   commands:", *[f"     {command}" for command in job.get("commands") or []]]
    return out


def data_words(item: Mapping[str, Any]) -> str:
    """A planned data input (``PlannedDataOut``): ``s3://acme-data/imagenet/ →
    imagenet: 200 files, 1.8 GiB; cached on idle machine local-1``."""
    holders = list(item.get("cached_on") or [])
    where = f"cached on idle machine {', '.join(holders)}" if holders else "not cached on any idle machine: downloaded"
    return f"{data_listing(item)}; {where}"


def data_listing(item: Mapping[str, Any]) -> str:
    """A data input and its listing: ``s3://acme-data/imagenet/ → imagenet:
    200 files, 1.8 GiB``; ``… → imagenet: listing not known`` without one."""
    if item.get("file_count") is None:
        return f"{item['uri']} → {item['path']}: listing not known"
    count = int(item["file_count"])
    return f"{item['uri']} → {item['path']}: {count:,} file{'s' * (count != 1)}, {size(item.get('total_size'))}"


def data_lines(run: Mapping[str, Any]) -> list[str]:
    """``  train: data s3://acme-data/imagenet/ → imagenet: 200 files, 1.8 GiB
    (versioned)`` for each data input and ``  train: volume ckpt at /data``
    for each volume of each job (``trainyard show``)."""
    lines = []
    for job in run.get("jobs") or []:
        for item in job.get("data_inputs") or []:
            notes = [
                n for n, on in (("versioned", item.get("versioned")), ("writable", not item.get("read_only"))) if on
            ]
            lines.append(f"  {job['name']}: data {data_listing(item)}" + (f" ({', '.join(notes)})" if notes else ""))
        for volume in job.get("volumes") or []:
            mode = " (read-only)" if volume.get("read_only") else ""
            lines.append(f"  {job['name']}: volume {volume['name']} at {volume['path']}{mode}")
    return lines


def planned_volume_words(item: Mapping[str, Any]) -> str:
    """A planned volume (``PlannedVolumeOut``): ``ckpt at ./ckpt (aws us-east-1
    us-east-1b, 1.0 GiB): held by job train of run r-12, the job waits for it``."""
    holder = item.get("held_by")
    state = f"held by job {holder['job']} of run {holder['run']}, the job waits for it" if holder else "free"
    mode = ", read-only" if item.get("read_only") else ""
    return f"{item['name']} at {item['path']} ({item['where']}, {size(item.get('size_bytes'))}{mode}): {state}"


def guard_lines(run: Mapping[str, Any]) -> list[str]:
    """``  train: stall: restarted from its last checkpoint after 20m without output``
    for each guard on a job's placement (``trainyard show``)."""
    lines = []
    for job in run.get("jobs") or []:
        placement = job.get("placement") or {}
        util, stall = placement.get("utilization_policy"), placement.get("stall")
        if isinstance(util, Mapping):
            lines.append(
                f"  {job['name']}: utilization_policy: stopped when every GPU stays below "
                f"{util.get('min_gpu_utilization')}% for {duration(util.get('time_window'))}"
            )
        if isinstance(stall, Mapping):
            what = "restarted from its last checkpoint" if stall.get("action") == "restart" else "stopped"
            lines.append(f"  {job['name']}: stall: {what} after {duration(stall.get('timeout'))} without output")
    return lines


def environment_words(outlook: Mapping[str, Any]) -> str:
    """A planned job's environment (``PlannedEnvironmentOut``) in a few words."""
    seconds = outlook.get("build_seconds")
    took = f"{seconds:.1f} s" if isinstance(seconds, (int, float)) else ""
    if outlook.get("state") == "ready":
        where = f" on {outlook['built_on']}" if outlook.get("built_on") else ""
        stored = "; stored, so other machines restore it" if outlook.get("stored") else "; other machines build it"
        return f"ready ({outlook.get('key')}, built{where}{f' in {took}' if took else ''}{stored})"
    if outlook.get("state") == "to build":
        return f"to be built ({f'the last build of this workflow took {took}' if took else 'never built before'})"
    return "unknown (the requirements' digests were not sent)"


def reused_words(run: str) -> str:
    """The server's own words for a cache hit (``Job.cache_decision``)."""
    return f"reused from {run} (cached)"


def reused_header(job: Mapping[str, Any]) -> str:
    """The line ``trainyard logs`` prints before a cached job's source log."""
    return f"--- {job['name']}: {reused_words(job['cached_from']['run'])} ---"


def cache_lines(run: Mapping[str, Any]) -> list[str]:
    """``  <job>: runs: code changed (train.py)`` for every decided job (``show``)."""
    return [
        f"  {job['name']}: {(job.get('cache_decision') or {}).get('text')}"
        for job in run.get("jobs") or []
        if (job.get("cache_decision") or {}).get("text")
    ]


def reused_artifact_lines(run: Mapping[str, Any], artifacts: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[str]:
    """``  train: reused from brave-otter-3 (cached): ./model (2 files, 3.0 KiB)``
    for each cached job; ``artifacts``: each source run's (they stay there)."""
    lines = []
    for job in run.get("jobs") or []:
        cache = job.get("cached_from")
        if not cache:
            continue
        found = [a for a in artifacts.get(cache["run"]) or [] if a.get("job") == cache["job"]]
        stored = ", ".join(f"{a['path']} ({_files(a)})" for a in found) or "no artifacts"
        lines.append(f"  {job['name']}: {reused_words(cache['run'])}: {stored}")
    return lines


def export_state(export: Mapping[str, Any]) -> str:
    """``copied``, ``copying``, ``pending``, ``failed: <reason>, retrying`` or ``failed: <reason>``."""
    status = export.get("status")
    if status == "done":
        return "copied"
    if status == "failed":
        return f"failed: {export.get('error') or 'no reason recorded'}"
    if export.get("error"):
        return f"failed: {export['error']}, retrying"
    return str(status)


def export_lines(exports: Sequence[Mapping[str, Any]]) -> list[str]:
    """``  train ./model → s3://acme-models/brave-otter-3/ (copied)`` for each export."""
    return [f"  {e['job_name']} {e['path']} → {e['destination']} ({export_state(e)})" for e in exports]


def _files(artifact: Mapping[str, Any]) -> str:
    files = artifact.get("files") or []
    return f"{len(files)} file{'s' * (len(files) != 1)}, {size(sum(f.get('size', 0) for f in files))}"


PLAN_HEADERS = ["JOB", "BACKEND", "REGION", "INSTANCE", "GPU", "SPOT", "PRICE", "MAX COST", "OFFERS"]


def offer_rows(plan: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """The run-creation answer's ``plan``: each job's cheapest matching offer
    and the most it may cost (``-``: no max_duration, or no offer)."""
    rows = []
    for job in plan:
        offer = job.get("offer") or {}
        if not offer.get("offers"):
            rows.append([job["job"], "-", "-", "-", "-", "-", "-", "-", f"0 ({offer.get('reason', 'no offer')})"])
            continue
        rows.append(
            [
                job["job"],
                offer["backend"],
                offer["region"],
                offer["instance_type"],
                gpu_words(offer.get("gpus") or []) or "-",
                "yes" if offer.get("spot") else "no",
                f"${offer['price_per_hour']:.4f}/h",
                money(job.get("max_cost")),
                str(offer["offers"]),
            ]
        )
    return rows


def max_cost_words(amount: str | None) -> str:
    """A job's estimate in the plan: ``$2.40 (its offer's price × max_duration)`` or why there is none."""
    if amount is None:
        return "unbounded (no max_duration, or no offer)"
    return f"{money(amount)} (its offer's price × max_duration)"


def estimate_words(plan: Mapping[str, Any]) -> str | None:
    """The run's estimate line under a plan (None: the server sent none)."""
    if "estimate" not in plan:
        return None
    if plan["estimate"] is None:
        return "Estimate: unbounded (a job has no max_duration or no offer; budgets count one billing minute)"
    return f"Estimate: at most {money(plan['estimate'])} (each job's cheapest offer × its max_duration)"


def offer_words(offer: Mapping[str, Any]) -> str:
    """``fake fake-small in r1, on-demand, $0.0500/h (cheapest of 3)`` or why
    there is none; a machine with GPUs names their exact model
    (``aws g6.xlarge (1× L4) in us-east-1, …``)."""
    if not offer.get("offers"):
        return f"none: {offer.get('reason', 'no offer')}"
    market = "spot" if offer.get("spot") else "on-demand"
    price = f"${offer['price_per_hour']:.4f}/h"
    gpus = gpu_words(offer.get("gpus") or [])
    where = f"{offer['backend']} {offer['instance_type']}{f' ({gpus})' if gpus else ''} in {offer['region']}"
    return f"{where}, {market}, {price} (cheapest of {offer['offers']})"


def gpu_words(gpus: Sequence[Mapping[str, Any]]) -> str:
    """``8× A100-40GB`` for a planned offer's GPU models; "" without GPUs."""
    return ", ".join(f"{g.get('count', 1)}× {g.get('model', '?')}" for g in gpus)


def dag_rows(run: Mapping[str, Any], artifacts: Sequence[Mapping[str, Any]]) -> list[list[str]]:
    """``trainyard show``'s rows: JOB, STATUS, NEEDS, STARTED, DURATION,
    CACHED FROM, ARTIFACTS (a cached job's are its source job's)."""
    rows = []
    for job in run.get("jobs") or []:
        cache = job.get("cached_from")
        owners = {job["id"], cache["job"]} if cache else {job["id"]}
        files = [f for a in artifacts if a.get("job") in owners for f in a.get("files") or []]
        stored = (
            f"{len(files)} file{'s' * (len(files) != 1)}, {size(sum(f.get('size', 0) for f in files))}"
            if files
            else "-"
        )
        rows.append(
            [
                job["name"],
                job.get("status", "?"),
                _waits(job) or "-",
                age(job.get("started_at")),
                duration(_seconds(job)),
                cache["run"] if cache else "-",
                stored,
            ]
        )
    return rows


def attempt_where(a: Mapping[str, Any]) -> str:
    """``g5.xlarge us-east-1b (spot)`` for a cloud machine; "-" for this
    host's runners, self-hosted machines and an attempt that had no machine."""
    if a.get("backend") in (None, "local", "self-hosted") or not a.get("instance_type"):
        return "-"
    market = "spot" if a.get("spot") else "on-demand"
    return f"{a['instance_type']} {a.get('zone') or a.get('region') or '?'} ({market})"


def attempt_rows(run: Mapping[str, Any]) -> list[list[str]]:
    """``trainyard show``'s attempts: JOB, ATTEMPT, INSTANCE, WHERE (type,
    zone, spot or on-demand), STARTED, ENDED, REASON; only for jobs that had
    more than one attempt or whose attempt ended other than by finishing
    normally."""
    rows = []
    for job in run.get("jobs") or []:
        attempts = job.get("attempts") or []
        normal = {"done", "error", "stopped_by_user", ""}
        if len(attempts) < 2 and all(a.get("reason", "") in normal for a in attempts):
            continue
        for a in attempts:
            reason = a.get("reason") or a.get("status", "")
            if a.get("message"):
                reason = f"{reason}: {a['message']}"
            if a.get("restored_checkpoint"):
                reason = f"{reason} (resumed from checkpoint {a['restored_checkpoint']})"
            rows.append(
                [
                    job["name"],
                    str(a["number"]),
                    a.get("instance") or "-",
                    attempt_where(a),
                    age(a.get("started_at")),
                    age(a.get("finished_at")) if a.get("finished_at") else "-",
                    truncate(reason),
                ]
            )
    return rows


class AttemptMarks:
    """Marks where each attempt of a job starts and ends in its one log
    (``trainyard logs``), from the attempts' seq ranges. A job that ran
    once, normally, gets no marks: its log reads as it always did."""

    def __init__(self, job: Mapping[str, Any]) -> None:
        attempts = sorted(job.get("attempts") or [], key=lambda a: a["number"])
        self._job = job["name"]
        self._pending = attempts if len(attempts) > 1 else []
        self._open: dict[str, Any] | None = None

    def around(self, lines: Iterable[tuple[int, str, str]]) -> Iterator[tuple[str, str]]:
        """The lines as (stream, text), with a mark line before each attempt's
        first line and after each attempt's last."""
        for seq, stream, text in lines:
            yield from self._up_to(seq)
            yield stream, text

    def rest(self) -> Iterator[tuple[str, str]]:
        """Marks of attempts after the last line (and the last one's end)."""
        yield from self._up_to(None)

    def _up_to(self, seq: int | None) -> Iterator[tuple[str, str]]:
        while self._pending and (seq is None or self._pending[0].get("first_seq", 1) <= seq):
            if self._open is not None:
                yield "o", self._ended(self._open)
            self._open = self._pending.pop(0)
            restored = self._open.get("restored_checkpoint")
            resumed = f" · resumed from checkpoint {restored}" if restored else ""
            where = self._open.get("instance") or "-"
            machine = attempt_where(self._open)
            placed = f" · {machine}" if machine != "-" else ""
            yield "o", f"--- attempt {self._open['number']} of {self._job} on {where}{resumed}{placed} ---"
        if seq is None and self._open is not None and self._open.get("reason") not in ("", None, "done"):
            yield "o", self._ended(self._open)
            self._open = None

    @staticmethod
    def _ended(attempt: dict[str, Any]) -> str:
        message = f" ({attempt['message']})" if attempt.get("message") else ""
        return f"--- attempt {attempt['number']} ended: {attempt.get('reason') or 'unknown'}{message} ---"


def port_lines(run: Mapping[str, Any]) -> list[str]:
    """``  serve: port 41234 on local-1a2b3c4d`` for every port of a job that
    is running or about to (where to reach it: that machine)."""
    lines = []
    for job in run.get("jobs") or []:
        if job.get("status") not in ("assigned", "running"):
            continue
        where = f" on {job['instance']}" if job.get("instance") else ""
        lines += [f"  {job['name']}: port {port}{where}" for port in job.get("ports") or []]
    return lines


def environment_lines(run: Mapping[str, Any]) -> list[str]:
    """``  <job>  <key>`` for every job whose latest attempt ran in an environment."""
    lines = []
    for job in run.get("jobs") or []:
        attempts = job.get("attempts") or []
        key = attempts[-1].get("environment") if attempts else ""
        if key:
            lines.append(f"  {job['name']}  {key}")
    return lines


# How ``show`` words a re-run's verdict (the API's ``reproduced``; docs/ENVIRONMENTS.md, "Reproduced").
_REPRODUCED = {
    "reproduced": "reproduced — {}",
    "differs": "differs: {}",
    "not_comparable": "not comparable: {}",
    "pending": "pending ({})",
}


def rerun_line(run: Mapping[str, Any]) -> str:
    """``Re-run of <run>: reproduced — every artifact byte-identical (3
    files)``, or what differs, or why nothing could be compared; "" for a
    run that is no re-run."""
    original, verdict = run.get("rerun_of"), run.get("reproduced")
    if not original:
        return ""
    if not verdict:  # a server older than the verdict
        return f"Re-run of {original}"
    state = str(verdict.get("state", ""))
    return f"Re-run of {original}: " + _REPRODUCED.get(state, state + ": {}").format(verdict.get("detail", ""))


def input_lines(run: Mapping[str, Any]) -> list[str]:
    """``  <job>  <path> from <source>`` for every input of every job."""
    return [
        f"  {job['name']}  {i['path']} from {i['from']}"
        for job in run.get("jobs") or []
        for i in job.get("inputs") or []
    ]


def resources(spec: Mapping[str, Any]) -> str:
    """``cpu 4, memory 16.0 GiB, gpu 2x A100`` for a job's resources; ``any`` if none."""
    parts = [f"cpu {spec['cpu']}"] if spec.get("cpu") else []
    for key, label in (("memory_bytes", "memory"), ("disk_bytes", "disk"), ("shm_size_bytes", "shm")):
        if spec.get(key):
            parts.append(f"{label} {size(spec[key])}")
    if spec.get("gpu_count"):
        gpu_memory = f" {size(spec['gpu_memory_bytes'])}" if spec.get("gpu_memory_bytes") else ""
        parts.append(f"gpu {spec['gpu_count']}x {spec.get('gpu_name') or 'any'}{gpu_memory}")
    return ", ".join(parts) or "any"


def _waits(job: Mapping[str, Any]) -> str:
    running = [f"{name} (running)" for name in job.get("after_running") or []]
    return ", ".join([*(job.get("needs") or []), *running])


def _seconds(job: Mapping[str, Any]) -> float | None:
    start = parse_time(job.get("started_at"))
    if start is None:
        return None
    end = parse_time(job.get("finished_at")) or datetime.now(UTC)
    return max(0.0, (end - start).total_seconds())


# ---------------------------------------------------------------- metrics

SPARKS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float], width: int = 24) -> str:
    """``values`` (the last ``width`` of them) as block characters, lowest to highest."""
    shown = [v for v in values if v == v][-width:]  # NaN never equals itself
    if not shown:
        return ""
    low, high = min(shown), max(shown)
    if high == low:
        return SPARKS[3] * len(shown)
    return "".join(SPARKS[min(7, int((v - low) / (high - low) * 8))] for v in shown)


def metric_value(value: float | None, unit: str = "") -> str:
    """A metric's value for people: bytes as sizes, rates per second, percents, 4 significant digits."""
    if value is None or value != value:
        return "-"
    if unit == "B":
        return size(int(value))
    if unit == "B/s":
        return f"{size(int(value))}/s"
    if unit == "%":
        return f"{value:.0f}%"
    if unit in ("W", "°C"):
        return f"{value:.0f} {unit}"
    return f"{value:.4g}"


METRIC_UNITS = {"cpu": "%", "memory": "B", "disk_used": "B", "disk_total": "B", "net_rx": "B/s", "net_tx": "B/s",
                "util": "%", "memory_total": "B", "power": "W", "temperature": "°C"}  # fmt: skip


def metric_unit(name: str) -> str:
    """The unit of a system series by its name (``gpu0.power``: W); a training metric has none."""
    if name in METRIC_UNITS:
        return METRIC_UNITS[name]
    if name.startswith("gpu") and "." in name and name[3 : name.index(".")].isdigit():
        return METRIC_UNITS.get(name.split(".", 1)[1], "")
    return ""


def last_metrics_lines(jobs: Sequence[Mapping[str, Any]]) -> list[str]:
    """``show``'s Metrics section: per job its training metrics' last values
    (with their step), then CPU, memory and each GPU's utilisation and memory."""
    lines = []
    for job in jobs:
        last = job.get("last") or {}
        parts = []
        for name in job.get("training") or []:
            entry = last.get(name)
            if entry:
                step = f" (step {entry['step']})" if entry.get("step") is not None else ""
                parts.append(f"{name} {metric_value(entry['value'])}{step}")
        for name in ("cpu", "memory"):
            if name in last:
                parts.append(f"{name} {metric_value(last[name]['value'], metric_unit(name))}")
        gpus = sorted({n.split(".")[0] for n in last if n.startswith("gpu") and n.endswith(".util")})
        for gpu in gpus:
            util = metric_value(last[f"{gpu}.util"]["value"], "%")
            used, total = last.get(f"{gpu}.memory"), last.get(f"{gpu}.memory_total")
            memory = (
                f" {metric_value(used['value'], 'B')}/{metric_value(total['value'], 'B')}" if used and total else ""
            )
            parts.append(f"{gpu} {util}{memory}")
        counted = [f"{job[k]} {k}" for k in ("dropped", "malformed") if job.get(k)]
        if parts or counted:
            tail = f" ({', '.join(counted)})" if counted else ""
            lines.append(f"  {job['job']}: {', '.join(parts) or 'no values'}{tail}")
    return lines
