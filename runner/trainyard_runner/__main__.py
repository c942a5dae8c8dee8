"""``trainyard-runner``: parse options (flags or environment) and run the agent."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from .agent import Agent
from .resources import RESOURCES_VAR, declared_resources

log = logging.getLogger("trainyard_runner")
OUTLIVE_VAR = "TRAINYARD_RUNNER_JOBS_OUTLIVE"


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="trainyard-runner: %(message)s", stream=sys.stderr
    )
    token = args.token or _token_from_file()
    if not args.server or not token:
        log.error("--server and --token (or TRAINYARD_SERVER_URL and TRAINYARD_RUNNER_TOKEN) are required")
        return 2
    try:
        declared_resources()  # every Hello reads it: refuse a bad value now, not at each reconnect
    except ValueError as e:
        log.error("%s is not valid Resources JSON: %s", RESOURCES_VAR, e)
        return 2
    agent = Agent(
        server_url=args.server,
        token=token,
        work_dir=Path(args.work_dir).resolve(),
        give_up_after=args.give_up_after,
        drain_timeout=args.drain_timeout,
        address=args.address,
        jobs_outlive_runner=args.jobs_outlive_runner,
    )
    return asyncio.run(_run(agent))


async def _run(agent: Agent) -> int:
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _on_signal, agent, sig)
    return await agent.run()


def _on_signal(agent: Agent, sig: int) -> None:
    if agent.stopping:  # a second signal: no more waiting
        log.error("second %s, exiting now", signal.Signals(sig).name)
        os._exit(1)
    agent.stop(f"received {signal.Signals(sig).name}")


def _parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="trainyard-runner", description="Run Trainyard jobs on this machine.")
    p.add_argument(
        "--server",
        default=env("TRAINYARD_SERVER_URL"),
        help="server base URL, e.g. ws://127.0.0.1:8000 [TRAINYARD_SERVER_URL]",
    )
    p.add_argument(
        "--token",
        default=env("TRAINYARD_RUNNER_TOKEN"),
        help="runner token [TRAINYARD_RUNNER_TOKEN or TRAINYARD_RUNNER_TOKEN_FILE]",
    )
    p.add_argument(
        "--work-dir",
        default=env("TRAINYARD_RUNNER_DIR", "./trainyard-runner"),
        help="jobs, spools and the git cache live here [TRAINYARD_RUNNER_DIR]",
    )
    p.add_argument(
        "--give-up-after",
        type=float,
        default=300.0,
        help="exit 1 after this many seconds without the server while idle",
    )
    p.add_argument(
        "--drain-timeout",
        type=float,
        default=60.0,
        help="reconnect when log lines stay unacknowledged this long after a job ends",
    )
    p.add_argument(
        "--address",
        default=env("TRAINYARD_RUNNER_ADDRESS", ""),
        help="where other jobs of a run reach this machine's jobs; default: 127.0.0.1 for a loopback server,"
        " else the local address routed to the server [TRAINYARD_RUNNER_ADDRESS]",
    )
    p.add_argument(
        "--jobs-outlive-runner",
        action=argparse.BooleanOptionalAction,
        default=env(OUTLIVE_VAR, "1").strip().lower() not in ("0", "false", "no", "off", ""),
        help="keep the jobs' commands running when this process dies or gets SIGTERM; a runner started on the"
        " same work dir re-attaches to them (default: on; the local backend turns it off) [" + OUTLIVE_VAR + "]",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def _token_from_file() -> str:
    path = os.environ.get("TRAINYARD_RUNNER_TOKEN_FILE")
    return Path(path).read_text().strip() if path else ""


if __name__ == "__main__":
    sys.exit(main())
