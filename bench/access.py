"""Part ``access`` of ``make bench`` (bench/README.md): getting into a
running job through the relay.

A second web process is started beside the bench stack's; the local runner
is connected to the first (A), every client end goes to the second (B), so
each byte crosses the channel layer between two processes. One job holds
the sessions: it prints a ticker line RATE times a second for its whole
life (the log stream whose latency the shells must not disturb).

- echo: one terminal session runs ``cat > /dev/null``; ECHO_SAMPLES single
  keystrokes, each timed from its send to the terminal's echo of it.
- many shells: a follower on A measures the job's log frame latency for
  WINDOW seconds alone, then again while ``--shells`` terminal sessions each send
  one keystroke a second (their echo latency is the result, the log's p99
  its ratio to the first window).
- scp: a file of ``--scp-mb`` up and down through the relay with the stock
  ``scp`` (``trainyard ssh-config``'s host entry), and the same over
  plain loopback SSH: the runner's own SSH server (``serve_ssh``) on a TCP
  port in this process, so the ratio is the relay's cost alone.
- prompt: ``trainyard ssh RUN -- echo ready`` from its start to ``ready``,
  warm (after one call that made and registered the key).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
from websockets.asyncio.client import connect

from bench.lib import Api, log, percentile, second_web
from tests.support.frames import frame_span
from tests.support.stack import Stack

TARGET_ECHO_P50_MS, TARGET_ECHO_P99_MS = 15.0, 50.0
TARGET_SCP_RATIO = 0.5
TARGET_SHELLS_P99_MS = 100.0
TARGET_LOG_P99_GROWTH = 0.2
TARGET_PROMPT_S = 1.0

ECHO_SAMPLES = 500
WINDOW = 20.0  # seconds of each log-latency window
PROMPT_SAMPLES = 5
RATE = 20  # ticker lines per second

HOLDER = f"""
workflows:
  - name: shell-holder
    provider: bash
    commands:
      - while true; do echo "tick $(date +%s.%N)"; sleep {1 / RATE}; done
"""

# Many sessions and sockets from one user and one address stand for many people here.
UNLIMITED = {
    "TRAINYARD_RATE_WS_USER": "off",
    "TRAINYARD_RATE_WS_IP": "off",
    "TRAINYARD_WS_PER_USER": "1000",
    "TRAINYARD_SESSIONS_PER_USER": "1000",
    "TRAINYARD_SESSIONS_PER_JOB": "1000",
}


def bench_access(api: Api, stack: Stack, tmp: Path, *, shells: int = 100, scp_bytes: int = 1 << 30) -> dict[str, Any]:
    log("(12) into a running job through the relay: client ends on a second web process, runner on the first")
    for tool in ("ssh", "scp", "ssh-keygen"):
        if shutil.which(tool) is None:
            return {"error": f"`{tool}` not found: install Debian's openssh-client"}
    with stack.env_changed(UNLIMITED, restart=["web"]), second_web(stack) as b_url:
        run = api.submit("shell-holder", workflows_text=HOLDER)
        try:
            _wait_running(api, run["id"])
            b = Api(url=b_url, ws_url=b_url.replace("http", "ws", 1), token=api.token, workspace=api.workspace)
            result: dict[str, Any] = {}
            result["echo"] = asyncio.run(_echo(b, run["name"]))
            result["shells"] = asyncio.run(_many_shells(api, b, run, shells))
            home = tmp / "access-home"
            result["prompt"] = _prompt(b, run["name"], home)
            result["scp"] = _scp(b, run["name"], home, tmp, scp_bytes)
            return result
        finally:
            httpx.post(
                f"{api.url}/api/v1/workspaces/{api.workspace}/runs/{run['id']}/stop/",
                headers={"Authorization": f"Bearer {api.token}"},
                timeout=30,
            )
            api.wait_finished(run["id"], timeout=60)


def _wait_running(api: Api, run_id: str) -> None:
    deadline = time.monotonic() + 120
    while api.run(run_id)["status"] != "running":
        if time.monotonic() > deadline:
            raise RuntimeError("the shell-holder job did not start within 120 s")
        time.sleep(0.2)


# ---------------------------------------------------------------- terminals


class Terminal:
    """One terminal session's client end (binary frames: keystrokes and output)."""

    def __init__(self, api: Api, run: str) -> None:
        self.api, self.run = api, run
        self.output = bytearray()
        self.changed = asyncio.Event()

    async def open(self) -> None:
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {self.api.token}"}, timeout=30) as client:
            answer = await client.post(
                f"{self.api.url}/api/v1/workspaces/{self.api.workspace}/runs/{self.run}/sessions/",
                json={"kind": "terminal"},
            )
        if answer.status_code != 201:
            raise RuntimeError(f"grant refused ({answer.status_code}): {answer.text[:300]}")
        grant = answer.json()
        self.ws = await connect(
            grant["url"], additional_headers={"Authorization": f"Bearer {grant['token']}"}, max_size=None
        )
        while True:
            message = await asyncio.wait_for(self.ws.recv(), 30)
            if isinstance(message, str) and json.loads(message).get("type") == "ready":
                break
        self.reader = asyncio.create_task(self._read())
        await self.send(b"exec cat > /dev/null\n")  # the tty's own echo, nothing else, from here on
        await asyncio.sleep(0.5)

    async def _read(self) -> None:
        async for message in self.ws:
            if isinstance(message, bytes):
                self.output += message
                self.changed.set()

    async def send(self, data: bytes) -> None:
        await self.ws.send(data)

    async def echo_ms(self, key: bytes) -> float:
        """Milliseconds from sending ``key`` to seeing it come back."""
        start_at = len(self.output)
        sent = time.perf_counter()
        await self.send(key)
        while key not in self.output[start_at:]:
            self.changed.clear()
            await asyncio.wait_for(self.changed.wait(), 10)
        return (time.perf_counter() - sent) * 1000

    async def close(self) -> None:
        await self.ws.close()
        self.reader.cancel()


async def _echo(b: Api, run: str) -> dict[str, Any]:
    terminal = Terminal(b, run)
    await terminal.open()
    try:
        samples = []
        for i in range(ECHO_SAMPLES):
            samples.append(await terminal.echo_ms(bytes([ord("a") + i % 26])))
            if i % 60 == 59:
                await terminal.send(b"\n")
                await asyncio.sleep(0.01)
        return {
            "samples": len(samples),
            "p50_ms": _ms(statistics.median(samples)),
            "p99_ms": _ms(percentile(samples, 99)),
        }
    finally:
        await terminal.close()


async def _many_shells(a: Api, b: Api, run: dict[str, Any], shells: int) -> dict[str, Any]:
    alone = await _log_latency(a, run["id"], WINDOW)
    terminals = [Terminal(b, run["name"]) for _ in range(shells)]
    opened = await asyncio.gather(*(t.open() for t in terminals), return_exceptions=True)
    errors = [f"{type(e).__name__}: {e}" for e in opened if isinstance(e, BaseException)]
    live = [t for t, e in zip(terminals, opened, strict=True) if not isinstance(e, BaseException)]
    echoes: list[float] = []

    async def typist(terminal: Terminal, offset: float) -> None:
        await asyncio.sleep(offset)
        deadline = time.monotonic() + WINDOW
        while time.monotonic() < deadline:
            echoes.append(await terminal.echo_ms(b"k"))
            await asyncio.sleep(1.0)

    try:
        typing = asyncio.gather(*(typist(t, i / max(len(live), 1)) for i, t in enumerate(live)))
        loaded, _ = await asyncio.gather(_log_latency(a, run["id"], WINDOW), typing)
    finally:
        await asyncio.gather(*(t.close() for t in live), return_exceptions=True)
    return {
        "shells": len(live),
        "wanted": shells,
        "errors": errors[:5],
        "echoes": len(echoes),
        "echo_p50_ms": _ms(statistics.median(echoes)) if echoes else None,
        "echo_p99_ms": _ms(percentile(echoes, 99)) if echoes else None,
        "log_alone": alone,
        "log_loaded": loaded,
    }


async def _log_latency(api: Api, run_id: str, seconds: float) -> dict[str, Any]:
    """The job's log frames as a follower gets them: arrival minus the time
    its last line was read by the runner (same machine, same clock)."""
    url = f"{api.ws_url}/ws/v1/workspaces/{api.workspace}/runs/{run_id}/"
    latencies: list[float] = []
    async with connect(url, additional_headers={"Authorization": f"Bearer {api.token}"}, max_size=None) as ws:
        live_from = time.time() + 1.0  # the backlog sent at connect is not live
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                raw = await asyncio.wait_for(ws.recv(), left)
            except TimeoutError:
                break
            arrived = time.time()
            frame = json.loads(raw)
            if frame.get("type") != "logs" or arrived < live_from:
                continue
            latencies.append((arrived - frame_span(frame)[3]) * 1000)
    if not latencies:
        return {"frames": 0, "p50_ms": None, "p99_ms": None}
    return {
        "frames": len(latencies),
        "p50_ms": _ms(statistics.median(latencies)),
        "p99_ms": _ms(percentile(latencies, 99)),
    }


# ---------------------------------------------------------------- the CLI and scp


def _cli_env(b: Api, home: Path) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    return {
        **{k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"},
        "HOME": str(home),
        "XDG_CONFIG_HOME": str(home / ".config"),
        "TRAINYARD_URL": b.url,
        "TRAINYARD_TOKEN": b.token,
    }


def _trainyard() -> str:
    return str(Path(sys.executable).with_name("trainyard"))


def _prompt(b: Api, run: str, home: Path) -> dict[str, Any]:
    env = _cli_env(b, home)
    argv = [_trainyard(), "ssh", run, "--", "echo", "ready"]
    first = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    if first.returncode != 0 or "ready" not in first.stdout:
        return {"error": f"trainyard ssh failed ({first.returncode}): {first.stderr.strip()[-300:]}"}
    samples = []
    for _ in range(PROMPT_SAMPLES):
        started = time.perf_counter()
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        if done.returncode != 0:
            return {"error": f"trainyard ssh failed ({done.returncode}): {done.stderr.strip()[-300:]}"}
        samples.append(time.perf_counter() - started)
    return {"samples": len(samples), "median_s": round(statistics.median(samples), 3), "max_s": round(max(samples), 3)}


def _scp(b: Api, run: str, home: Path, tmp: Path, size: int) -> dict[str, Any]:
    env = _cli_env(b, home)
    configured = subprocess.run([_trainyard(), "ssh-config", run], env=env, capture_output=True, text=True, timeout=60)
    if configured.returncode != 0:
        return {"error": f"trainyard ssh-config failed: {configured.stderr.strip()[-300:]}"}
    config = home / ".config" / "trainyard" / "ssh" / "config"
    alias = next(
        line.split()[1] for line in config.read_text().splitlines() if line.startswith("Host ") and run in line
    )
    key = next(
        Path(line.split(None, 1)[1].strip().strip('"'))
        for line in config.read_text().splitlines()
        if line.strip().startswith("IdentityFile")
    )
    big = tmp / "scp-1g.bin"
    _random_file(big, size)
    back = tmp / "scp-back.bin"
    relay = {
        "up_s": _timed(["scp", "-q", "-F", str(config), str(big), f"{alias}:scp-1g.bin"], env),
        "down_s": _timed(["scp", "-q", "-F", str(config), f"{alias}:scp-1g.bin", str(back)], env),
    }
    same = _same_file(big, back)
    back.unlink(missing_ok=True)
    subprocess.run(["ssh", "-F", str(config), alias, "rm", "-f", "scp-1g.bin"], env=env, timeout=60)
    plain = _plain_loopback(big, back, key, tmp, env)
    big.unlink(missing_ok=True)
    back.unlink(missing_ok=True)
    mb = size / 1e6
    return {
        "bytes": size,
        "identical": same,
        "relay_up_mb_s": round(mb / relay["up_s"], 1),
        "relay_down_mb_s": round(mb / relay["down_s"], 1),
        "plain_up_mb_s": round(mb / plain["up_s"], 1),
        "plain_down_mb_s": round(mb / plain["down_s"], 1),
        "ratio_up": round(plain["up_s"] / relay["up_s"], 2),
        "ratio_down": round(plain["down_s"] / relay["down_s"], 2),
    }


def _plain_loopback(big: Path, back: Path, key: Path, tmp: Path, env: dict[str, str]) -> dict[str, float]:
    """The same scp against the runner's SSH server on a loopback TCP port (no relay)."""
    from trainyard_runner.sessions.context import SessionContext
    from trainyard_runner.sessions.hostkey import load_or_create_host_key, public_line
    from trainyard_runner.sessions.ssh import serve_ssh

    work = tmp / "plain-ssh"
    work.mkdir(exist_ok=True)
    host_key = load_or_create_host_key(work)
    known = work / "known_hosts"
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    known.write_text(f"[127.0.0.1]:{port} {public_line(host_key)}\n")
    authorized = [Path(f"{key}.pub").read_text().strip()]
    context = SessionContext(cwd=work, env=dict(os.environ), uid=None, gid=None)
    loop = asyncio.new_event_loop()

    sessions: set[asyncio.Task[None]] = set()

    async def serve() -> None:
        listener.setblocking(False)
        while True:
            conn, _ = await loop.sock_accept(listener)
            task = loop.create_task(serve_ssh(conn, context, authorized, host_key))
            sessions.add(task)
            task.add_done_callback(sessions.discard)

    threading.Thread(target=loop.run_forever, daemon=True).start()
    serving = asyncio.run_coroutine_threadsafe(serve(), loop)
    options = [
        "-F", "/dev/null", "-P", str(port), "-i", str(key), "-o", "IdentitiesOnly=yes",
        "-o", f"UserKnownHostsFile={known}", "-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes",
    ]  # fmt: skip
    try:
        return {
            "up_s": _timed(["scp", "-q", *options, str(big), "127.0.0.1:scp-1g.bin"], env),
            "down_s": _timed(["scp", "-q", *options, "127.0.0.1:scp-1g.bin", str(back)], env),
        }
    finally:
        serving.cancel()
        loop.call_soon_threadsafe(loop.stop)
        listener.close()
        shutil.rmtree(work, ignore_errors=True)


def _timed(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv[:2])} … failed ({done.returncode}): {done.stderr.strip()[-300:]}")
    return time.perf_counter() - started


def _random_file(path: Path, size: int) -> None:
    chunk = os.urandom(1 << 20)
    with path.open("wb") as f:
        for i in range(size >> 20):
            f.write(bytes([i & 0xFF]) + chunk[1:])


def _same_file(a: Path, b: Path) -> bool:
    if a.stat().st_size != b.stat().st_size:
        return False
    with a.open("rb") as fa, b.open("rb") as fb:
        while block := fa.read(1 << 22):
            if block != fb.read(1 << 22):
                return False
    return True


def _size(size: int) -> str:
    return f"{size >> 30} GiB" if size >= 1 << 30 and size % (1 << 30) == 0 else f"{size >> 20} MiB"


def _ms(value: float) -> float:
    return round(value, 1)


# ---------------------------------------------------------------- table


def access_rows(result: dict[str, Any], row: Any) -> None:
    if "error" in result:
        row("access: through the relay", result["error"], "-", False)
        return
    echo = result["echo"]
    row(
        f"keystroke echo through the relay (client on web B, runner on A), p50 / p99 of {echo['samples']}",
        f"{echo['p50_ms']} / {echo['p99_ms']} ms",
        f"≤ {TARGET_ECHO_P50_MS:.0f} / ≤ {TARGET_ECHO_P99_MS:.0f} ms",
        echo["p50_ms"] <= TARGET_ECHO_P50_MS and echo["p99_ms"] <= TARGET_ECHO_P99_MS,
    )
    scp = result["scp"]
    if "error" in scp:
        row("scp through the relay vs plain loopback SSH", scp["error"], f"≥ {TARGET_SCP_RATIO:.0%}", False)
    else:
        for way in ("up", "down"):
            row(
                f"scp of {_size(scp['bytes'])} {way} through the relay vs the same server on loopback "
                f"({scp[f'relay_{way}_mb_s']} vs {scp[f'plain_{way}_mb_s']} MB/s; identical: {scp['identical']})",
                f"{scp[f'ratio_{way}']:.0%}",
                f"≥ {TARGET_SCP_RATIO:.0%}",
                scp[f"ratio_{way}"] >= TARGET_SCP_RATIO and scp["identical"],
            )
    shells = result["shells"]
    alone, loaded = shells["log_alone"]["p99_ms"], shells["log_loaded"]["p99_ms"]
    growth = (loaded / alone - 1) if alone and loaded else None
    row(
        f"{shells['shells']} shells on one job, each echoing once a second: echo p99 (p50 {shells['echo_p50_ms']} ms)",
        f"{shells['echo_p99_ms']} ms",
        f"≤ {TARGET_SHELLS_P99_MS:.0f} ms",
        shells["shells"] == shells["wanted"]
        and shells["echo_p99_ms"] is not None
        and shells["echo_p99_ms"] <= TARGET_SHELLS_P99_MS,
    )
    row(
        f"  the job's log frame latency p99 with them vs alone ({loaded} vs {alone} ms)",
        f"{growth:+.0%}" if growth is not None else "no frames",
        f"≤ +{TARGET_LOG_P99_GROWTH:.0%}",
        growth is not None and growth <= TARGET_LOG_P99_GROWTH,
    )
    prompt = result["prompt"]
    if "error" in prompt:
        row("trainyard ssh RUN to a prompt, warm", prompt["error"], f"≤ {TARGET_PROMPT_S:.0f} s", False)
    else:
        row(
            f"trainyard ssh RUN -- echo ready, warm: median of {prompt['samples']} (max {prompt['max_s']} s)",
            f"{prompt['median_s']} s",
            f"≤ {TARGET_PROMPT_S:.0f} s",
            prompt["median_s"] <= TARGET_PROMPT_S,
        )
