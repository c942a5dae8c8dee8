"""Following a run live over its websocket until it is done.

The server sends ``{"type": "run", "run": …}`` at connect and on every status
change, and ``{"type": "logs", "job", "first_seq", "streams", "times", "text"}``
with the stored lines after ``after_seq`` first, then new ones. A follower is
done when the run is finished and it has printed every job's lines up to that
job's ``last_seq``.

Drops are survived: the follower reconnects with ``after_seq`` set to the
lowest seq it has printed across the jobs it knows (the server applies one
``after_seq`` to every job) and drops lines it has already printed, per job.
If the run is finished but lines are still missing after a quiet moment,
they are fetched over REST, so a follower always ends. After
``STATUS_CHECK_SECONDS`` without a frame the run's status is read over REST
too: a lost final status event does not leave the follower waiting forever.

A run of several jobs has each line prefixed with ``[<job name>] ``; a
single job's lines are printed as they are. A job reused from the cache has
no lines of its own: ``on_reused`` is called once for it when a run update
first shows it reused (``trainyard logs -f`` prints its source's log there).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from websockets.exceptions import ConnectionClosed, InvalidHandshake, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from .api import FINISHED, ApiError, Client, Job, Run
from .output import LogWriter, line_stamp

RECV_TIMEOUT = 1.0
CATCH_UP_AFTER = 3.0  # seconds of quiet on a finished run before REST catch-up
MAX_BACKOFF = 10.0
GIVE_UP_AFTER = 120.0  # seconds without any successful connection
# Seconds without a frame after which the run's status is read over REST.
STATUS_CHECK_SECONDS = float(os.environ.get("TRAINYARD_STATUS_CHECK_SECONDS") or 30.0)
# The server's "over a limit, retry later" close: connects per minute, or open sockets per user.
CLOSE_LIMITED = 4429
_CLOSE_MESSAGES = {
    4401: "the server refused the websocket: no valid credentials (check TRAINYARD_TOKEN, or run `trainyard login`)",
    4403: "you have no access to this run's workspace",
    4404: "no such run in this workspace",
}


class Follower:
    """Prints a run's log lines and reports its status until it is done.

    ``seen`` maps job id → the highest seq already printed (e.g. by a REST
    read before following); ``on_run`` gets every run update; ``on_reused``
    every job reused from the cache, once (``announced``: ids already shown).
    """

    def __init__(
        self,
        client: Client,
        run: str,
        *,
        writer: LogWriter,
        on_run: Callable[[Run], None],
        before_logs: Callable[[], None] = lambda: None,
        seen: dict[str, int] | None = None,
        on_reused: Callable[[Job], None] = lambda job: None,
        announced: set[str] | None = None,
        only: set[str] | None = None,
        timestamps: bool = False,
    ) -> None:
        self.client = client
        self.run_name = run
        self.writer = writer
        self.on_run = on_run
        self.before_logs = before_logs
        self.seen: dict[str, int] = dict(seen or {})
        self.run: Run | None = None
        self.on_reused = on_reused
        self.announced: set[str] = set(announced or ())
        self.only = only  # the job ids whose lines are printed (None: all)
        self.timestamps = timestamps  # each line starts with its UTC time (``output.line_stamp``)
        self._limited = ""  # the last limit the server named when it refused the socket

    def follow(self) -> Run:
        """Block until the run is done; returns its final state."""
        backoff, last_ok = 0.5, time.monotonic()
        while True:
            try:
                with self._connect() as ws:
                    backoff, last_ok = 0.5, time.monotonic()
                    if self._pump(ws):
                        assert self.run is not None
                        return self.run
            except ConnectionClosed as e:
                code = e.rcvd.code if e.rcvd else None
                if code in _CLOSE_MESSAGES:
                    raise ApiError(_close_message(code, self.run_name)) from None
                if code == CLOSE_LIMITED and e.rcvd is not None:
                    self._note_limited(e.rcvd.reason)
                if self.done():
                    assert self.run is not None
                    return self.run
            except InvalidStatus as e:
                status = e.response.status_code
                if status in (401, 403, 404):
                    raise ApiError(_close_message(4400 + status, self.run_name), status=status) from None
            except (OSError, InvalidHandshake, TimeoutError):
                pass
            if time.monotonic() - last_ok > GIVE_UP_AFTER:
                raise ApiError(
                    f"lost the connection to Trainyard at {self.client.url} for {GIVE_UP_AFTER:.0f}s; "
                    f"the run continues — `trainyard logs -f {self.run_name}` to resume"
                )
            time.sleep(backoff)
            backoff = min(backoff * 2, MAX_BACKOFF)

    def _note_limited(self, reason: str) -> None:
        """Over a server limit (too many connects, too many open sockets):
        said once on stderr, then retried with the backoff until it clears."""
        if reason and reason != self._limited:
            self._limited = reason
            self.writer.write([("e", f"trainyard: the server refused the websocket ({reason}); retrying")])

    def done(self) -> bool:
        run = self.run
        if run is None or run["status"] not in FINISHED:
            return False
        return all(self.seen.get(job["id"], 0) >= job.get("last_seq", 0) for job in run["jobs"])

    def after_seq(self) -> int:
        """The seq to resume from: the lowest printed across known jobs."""
        jobs = {job["id"] for job in self.run["jobs"]} if self.run else set()
        jobs |= set(self.seen)
        return min((self.seen.get(job, 0) for job in jobs), default=0)

    def _connect(self) -> ClientConnection:
        url = self.client.ws_url(self.run_name, after_seq=self.after_seq())
        headers = {"Authorization": f"Bearer {self.client.token}"}
        return connect(url, additional_headers=headers, open_timeout=10, max_size=None, close_timeout=2)

    def _pump(self, ws: ClientConnection) -> bool:
        """Handle frames until done (True) or the connection drops (raises)."""
        quiet_since = checked_at = time.monotonic()
        while True:
            try:
                frame = ws.recv(timeout=RECV_TIMEOUT)
            except TimeoutError:
                if self.done():
                    return True
                if self.run and self.run["status"] in FINISHED and time.monotonic() - quiet_since > CATCH_UP_AFTER:
                    self._catch_up()
                    return True
                if time.monotonic() - max(quiet_since, checked_at) > STATUS_CHECK_SECONDS:
                    checked_at = time.monotonic()
                    self._check_status()
                continue
            quiet_since = time.monotonic()
            self._handle(frame)
            if self.done():
                return True

    def _handle(self, frame: str | bytes) -> None:
        try:
            message = json.loads(frame)
        except ValueError:
            return
        if not isinstance(message, dict):
            return
        if message.get("type") == "run" and isinstance(message.get("run"), dict):
            self.run = message["run"]
            self.on_run(message["run"])
            self._announce(message["run"])
        elif message.get("type") == "logs":
            self._print(str(message.get("job")), message)

    def _print(self, job: str, frame: dict[str, Any]) -> None:
        """A ``logs`` frame: lines ``first_seq`` … in one text, each ended by
        a newline, with one stream letter per line (docs/API.md)."""
        first = int(frame.get("first_seq") or 0)
        streams, text = str(frame.get("streams") or ""), str(frame.get("text") or "")
        skip = max(0, self.seen.get(job, 0) + 1 - first)
        if skip >= len(streams):
            return
        texts = text.split("\n")[skip : len(streams)]
        stamps = _line_times(frame.get("times"), len(streams))[skip:]
        self._write(job, zip(streams[skip:], texts, stamps, strict=True), first + len(streams) - 1)

    def _write(self, job: str, lines: Iterable[tuple[str, str, float | None]], last_seq: int) -> None:
        """Print (stream, text, unix time) lines of ``job``, the last of them ``last_seq``."""
        if self.only is None or job in self.only:
            self.before_logs()
            prefix = job_prefixes(self.run).get(job, "") if self.run else ""
            stamped = self.timestamps
            self.writer.write(
                (stream, prefix + (line_stamp(ts) if stamped else "") + text) for stream, text, ts in lines
            )
        self.seen[job] = last_seq

    def _check_status(self) -> None:
        """The run as REST sees it, in case its last status event was lost;
        a finished run is then caught up on the next quiet second."""
        try:
            run = self.client.get_run(self.run_name)
        except ApiError:
            return  # the websocket is still up: try again later
        if self.run is None or run["status"] != self.run["status"]:
            self.on_run(run)
        self.run = run
        self._announce(run)

    def _announce(self, run: Run) -> None:
        for job in run.get("jobs") or []:
            if job.get("cached_from") and job["id"] not in self.announced:
                self.announced.add(job["id"])
                self.before_logs()
                self.on_reused(job)

    def _catch_up(self) -> None:
        """Fetch over REST the lines the websocket has not delivered."""
        assert self.run is not None
        for job in self.run["jobs"]:
            if self.seen.get(job["id"], 0) >= job.get("last_seq", 0):
                continue
            for page in self.client.iter_job_logs(job["id"], after_seq=self.seen.get(job["id"], 0)):
                fresh = [line for line in page if line["seq"] > self.seen.get(job["id"], 0)]
                if fresh:
                    shown = [(line["stream"], line["text"], line.get("ts")) for line in fresh]
                    self._write(job["id"], shown, fresh[-1]["seq"])
            if self.seen.get(job["id"], 0) < job.get("last_seq", 0):
                self.seen[job["id"]] = job["last_seq"]  # the server stored fewer lines than it counted


def _line_times(times: object, count: int) -> list[float | None]:
    """Each line's unix time from a frame's ``times`` (runs of ``[lines, ts]``)."""
    out: list[float | None] = []
    for run in times if isinstance(times, list) else []:
        if isinstance(run, list) and len(run) == 2 and isinstance(run[0], int) and isinstance(run[1], (int, float)):
            out += [float(run[1])] * run[0]
    return (out + [None] * count)[:count]


def job_prefixes(run: Run) -> dict[str, str]:
    """Job id → ``"[<job name>] "`` for a run of several jobs; empty for one."""
    jobs = run.get("jobs") or []
    return {job["id"]: f"[{job['name']}] " for job in jobs} if len(jobs) > 1 else {}


def _close_message(code: int, run: str) -> str:
    message = _CLOSE_MESSAGES.get(code, f"the server closed the connection (code {code})")
    return f"run {run}: {message}" if code == 4404 else message
