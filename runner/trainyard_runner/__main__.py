"""``trainyard-runner``: parse options (flags, environment, or the
``runner.json`` that ``trainyard-runner register`` saved) and run the agent;
``trainyard-runner register …`` registers a self-hosted machine (``register.py``)."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from pathlib import Path

from . import register
from .agent import Agent
from .resources import RESOURCES_VAR, declared_resources

log = logging.getLogger("trainyard_runner")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["register"]:
        return register.main(argv[1:])
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="trainyard-runner: %(message)s", stream=sys.stderr
    )
    server, token = args.server, args.token or _token_from_file()
    if not server or not token:
        # A registered machine: flags and environment win over runner.json.
        try:
            saved = register.load_config(Path(args.work_dir).resolve())
        except register.RegisterError as e:
            log.error("%s", e)
            return 2
        if saved is not None:
            server, token = server or saved.server_url, token or saved.runner_token
    if not server or not token:
        log.error(
            "--server and --token (or TRAINYARD_SERVER_URL and TRAINYARD_RUNNER_TOKEN) are required,"
            " or register this machine first: trainyard-runner register --url <server> --token <registration token>"
        )
        return 2
    try:
        declared_resources()  # every Hello reads it: refuse a bad value now, not at each reconnect
    except ValueError as e:
        log.error("%s is not valid Resources JSON: %s", RESOURCES_VAR, e)
        return 2
    agent = Agent(
        server_url=server,
        token=token,
        work_dir=Path(args.work_dir).resolve(),
        give_up_after=args.give_up_after,
        drain_timeout=args.drain_timeout,
        address=args.address,
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
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def _token_from_file() -> str:
    path = os.environ.get("TRAINYARD_RUNNER_TOKEN_FILE")
    return Path(path).read_text().strip() if path else ""


if __name__ == "__main__":
    sys.exit(main())
