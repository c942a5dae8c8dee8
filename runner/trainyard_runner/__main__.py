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
import time
from pathlib import Path

from . import http, kept, machine, register, retry
from .agent import EXIT_POWER_OFF, Agent
from .resources import RESOURCES_VAR, declared_resources
from .spot import DEFAULT_TERMINATION_GRACE, NOTICE_EVERY, REBALANCE_EVERY, SpotWatcher, pod_termination_notice

log = logging.getLogger("trainyard_runner")
OUTLIVE_VAR = "TRAINYARD_RUNNER_JOBS_OUTLIVE"
ABSOLUTE_VAR = "TRAINYARD_RUNNER_ABSOLUTE_PATHS"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["register"]:
        return register.main(argv[1:])
    args = _parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO, format="trainyard-runner: %(message)s", stream=sys.stderr
    )
    work_dir = Path(args.work_dir).resolve()
    # After the bootstrap exchange the saved token is the runner's own: it wins.
    server, token = args.server, machine.saved_token(work_dir) or args.token or _token_from_file()
    if not server or not token:
        # A registered machine: flags and environment win over runner.json.
        try:
            saved = register.load_config(work_dir)
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
    try:
        http.pin_token_origin(args.api_origin or server)
    except ValueError as e:
        log.error("--api-origin / --server: %s", e)
        return 2
    identity = machine.cloud_identity(args.cloud)
    agent = Agent(
        server_url=server,
        token=token,
        work_dir=work_dir,
        give_up_after=args.give_up_after,
        drain_timeout=args.drain_timeout,
        address=args.address,
        power_off_after=args.power_off_after,
        cloud=identity,
        jobs_outlive_runner=args.jobs_outlive_runner,
        absolute_paths=args.absolute_paths,
        keep_failed_seconds=args.keep_failed_seconds,
        kept_retry_seconds=args.kept_retry_seconds,
        api_origin_fixed=bool(args.api_origin),
    )
    retry.configure(seconds=args.retry_seconds)
    if args.cloud == "aws":
        agent.spot = SpotWatcher(
            machine.Imds(),
            on_notice=agent.on_notice,
            on_rebalance=agent.on_rebalance,
            notice_every=args.spot_poll_seconds,
            rebalance_every=args.rebalance_poll_seconds,
        )
    lifetime = _Lifetime(args.max_lifetime, work_dir)
    grace = args.termination_grace if args.cloud == "kubernetes" else None
    code = asyncio.run(_run(agent, lifetime, grace))
    if code == EXIT_POWER_OFF or lifetime.over:
        why = lifetime.reason if lifetime.over else "the server was unreachable while idle"
        machine.power_off(args.power_off_command or machine.default_power_off_command(), why)
        return EXIT_POWER_OFF
    return code


class _Lifetime:
    """``--max-lifetime``, counted from the runner's first start in this work
    dir (a restarted runner does not start the clock again): then the runner
    stops its job (reported as stopped by the runner, with this reason),
    exits and powers off."""

    def __init__(self, seconds: float, work_dir: Path) -> None:
        self.seconds = seconds
        self.work_dir = work_dir
        self.over = False
        self.reason = f"the runner reached its maximum lifetime of {machine.describe_seconds(seconds)}"

    def arm(self, agent: Agent) -> None:
        if self.seconds > 0:
            left = self.seconds - (time.time() - machine.first_start(self.work_dir))
            asyncio.get_running_loop().call_later(max(left, 0.0), self._end, agent)

    def _end(self, agent: Agent) -> None:
        self.over = True
        agent.stop(self.reason)


async def _run(agent: Agent, lifetime: _Lifetime, termination_grace: float | None) -> int:
    """``termination_grace`` (``--cloud kubernetes``): SIGTERM is the pod's
    termination, ``Agent.on_termination``, not a stop of the runner alone."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, _on_signal, agent, sig)
    if termination_grace is not None:
        loop.add_signal_handler(signal.SIGTERM, _on_pod_termination, agent, termination_grace)
    lifetime.arm(agent)
    return await agent.run()


def _on_pod_termination(agent: Agent, grace: float) -> None:
    """The pod is being deleted: the machine goes when its grace is over.
    Another SIGTERM changes nothing (the deadline stands)."""
    if agent.leaving:
        log.info("another SIGTERM: the jobs are already winding down")
        return
    agent.on_termination(pod_termination_notice(grace))


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
        "--api-origin",
        default=env("TRAINYARD_RUNNER_API_ORIGIN", ""),
        help="the only origin the runner sends its token to over REST, e.g. https://trainyard.example.com;"
        " default: the one the server names in its welcome, else --server's [TRAINYARD_RUNNER_API_ORIGIN]",
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
        help="exit 1 after this many seconds without the server while idle (0: never)",
    )
    p.add_argument(
        "--power-off-after",
        type=float,
        default=float(env("TRAINYARD_RUNNER_POWER_OFF_AFTER", "0")),
        help="power the machine off after this many seconds without the server while idle (0: never; cloud"
        " machines) [TRAINYARD_RUNNER_POWER_OFF_AFTER]",
    )
    p.add_argument(
        "--max-lifetime",
        type=float,
        default=float(env("TRAINYARD_RUNNER_MAX_LIFETIME", "0")),
        help="after this many seconds from start, stop the job and power the machine off (0: never)"
        " [TRAINYARD_RUNNER_MAX_LIFETIME]",
    )
    p.add_argument(
        "--power-off-command",
        default=env("TRAINYARD_POWER_OFF_COMMAND", ""),
        help="how to power the machine off; default `systemctl poweroff` under systemd, else"
        " `shutdown -h now` [TRAINYARD_POWER_OFF_COMMAND]",
    )
    p.add_argument(
        "--cloud",
        default=env("TRAINYARD_RUNNER_CLOUD", ""),
        choices=["", "aws", "kubernetes"],
        help="where the machine runs: aws reads IMDSv2 (AWS_EC2_METADATA_SERVICE_ENDPOINT or 169.254.169.254) for"
        " the hello and its spot interruption notices; kubernetes takes SIGTERM as the pod's termination"
        " (--termination-grace) [TRAINYARD_RUNNER_CLOUD]",
    )
    p.add_argument(
        "--termination-grace",
        type=float,
        default=float(env("TRAINYARD_RUNNER_TERMINATION_GRACE", str(DEFAULT_TERMINATION_GRACE))),
        help="with --cloud kubernetes: the pod's grace period between its SIGTERM and its SIGKILL; the jobs wind"
        " down and the runner exits within it [TRAINYARD_RUNNER_TERMINATION_GRACE]",
    )
    p.add_argument(
        "--spot-poll-seconds",
        type=float,
        default=float(env("TRAINYARD_RUNNER_SPOT_POLL_SECONDS", str(NOTICE_EVERY))),
        help="with --cloud aws: how often to read spot/instance-action (an interruption notice)"
        " [TRAINYARD_RUNNER_SPOT_POLL_SECONDS]",
    )
    p.add_argument(
        "--rebalance-poll-seconds",
        type=float,
        default=float(env("TRAINYARD_RUNNER_REBALANCE_POLL_SECONDS", str(REBALANCE_EVERY))),
        help="with --cloud aws: how often to read events/recommendations/rebalance"
        " [TRAINYARD_RUNNER_REBALANCE_POLL_SECONDS]",
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
    p.add_argument(
        "--absolute-paths",
        action=argparse.BooleanOptionalAction,
        default=env(ABSOLUTE_VAR, "1").strip().lower() not in ("0", "false", "no", "off", ""),
        help="let jobs upload artifacts from, and restore inputs to, absolute paths of this machine (a conda env"
        " folder); default: on; the local backend, on the server's own host, turns it off [" + ABSOLUTE_VAR + "]",
    )
    p.add_argument(
        "--retry-seconds",
        type=float,
        default=float(env("TRAINYARD_RUNNER_RETRY_SECONDS", str(retry.RETRY_SECONDS))),
        help="how long an upload or download keeps retrying network and server errors (backoff with jitter)",
    )
    p.add_argument(
        "--keep-failed-seconds",
        type=float,
        default=float(env("TRAINYARD_RUNNER_KEEP_FAILED_SECONDS", str(kept.KEEP_SECONDS))),
        help="how long the files of a job whose artifacts could not be uploaded are kept (under <work dir>/kept/)",
    )
    p.add_argument(
        "--kept-retry-seconds",
        type=float,
        default=float(env("TRAINYARD_RUNNER_KEPT_RETRY_SECONDS", str(kept.RETRY_FIRST))),
        help="first pause between the tries of uploading kept files again (doubling to 10 minutes)",
    )
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def _token_from_file() -> str:
    path = os.environ.get("TRAINYARD_RUNNER_TOKEN_FILE")
    return Path(path).read_text().strip() if path else ""


if __name__ == "__main__":
    sys.exit(main())
