"""Session-wide rules and the end-to-end ``stack`` fixture.

Tests run against real Postgres and Redis/Valkey: ``make test`` starts
embedded ones and sets DATABASE_URL / REDIS_URL. Without both variables the
session stops at once rather than half-running (or running against the
servers of a ``make run`` in another terminal).
"""

from __future__ import annotations

import faulthandler
import os
import secrets
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import iid
from tests.support.ec2boot import ec2_boot  # noqa: F401 - plays EC2's boot of moto's instances
from tests.support.github import GithubServer
from tests.support.kubeapi import kube_api  # noqa: F401 - a Kubernetes API server (kmock) over HTTP
from tests.support.kubelet import kubelet  # noqa: F401 - plays the nodes of kube_api's cluster
from tests.support.moto import MotoServer, aws, moto_server  # noqa: F401 - fixtures for the AWS tests
from tests.support.stack import REPORTED, Stack, reported
from tests.support.web import WebServers

MISSING_SERVICES_MESSAGE = (
    "run the tests with `make test` (it starts Postgres and Valkey), or set DATABASE_URL and REDIS_URL"
)


def pytest_sessionstart(session: pytest.Session) -> None:
    if not (os.environ.get("DATABASE_URL") and os.environ.get("REDIS_URL")):
        pytest.exit(MISSING_SERVICES_MESSAGE, returncode=pytest.ExitCode.USAGE_ERROR)


@pytest.fixture(scope="session", autouse=True)
def _interpreter_reachable_by_jobs() -> None:
    """A root runner runs each job as a user of its own (docs/RUNNER.md, "The
    job's user"); the suite's jobs call this interpreter, which on the
    development machines lives under a private ``/root`` (pyenv): its
    folders are made searchable (``o+x``, never readable), as a system
    python's are."""
    from trainyard_runner.jobuser import isolating, make_reachable

    if isolating():
        make_reachable(Path(sys.executable).resolve().parent)


@pytest.fixture(scope="session", autouse=True)
def _own_rate_limit_counters() -> None:
    """Rate-limit counters of this session only: a re-run within the same
    minute starts from zero instead of inheriting the last run's hits."""
    from django.conf import settings

    settings.TRAINYARD["RATE_LIMIT_PREFIX"] = f"test-{secrets.token_hex(4)}:ratelimit"


@pytest.fixture(scope="session", autouse=True)
def _trust_the_test_identity_key() -> None:
    """EC2 identity documents in the tests are signed by the test key
    (tests/support/iid.py), which the server trusts instead of AWS's
    certificates; the stack's processes get it in their environment."""
    from django.conf import settings

    settings.TRAINYARD["AWS_IDENTITY_CERTIFICATES"] = iid.certificate_pem()


@pytest.fixture(scope="session")
def stack_github() -> Iterator[GithubServer]:
    """The local GitHub stand-in the stack signs in with (browser tests: tests/e2e/test_dashboard.py).

    Started before the stack, because its settings are read from the web
    process's environment at start; the ``stack`` fixture sets its callback.
    Set ``next_user`` before each browser sign-in.
    """
    server = GithubServer(client_id="Iv1.trainyard-e2e", client_secret="e2e-secret", callback_url="").start()
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(scope="session")
def stack(
    tmp_path_factory: pytest.TempPathFactory, stack_github: GithubServer, request: pytest.FixtureRequest
) -> Iterator[Stack]:
    """Web, Celery worker and beat on a fresh database; shared by the whole session.
    Its boto3 talks to the session's moto server (tests reset it with the ``aws`` fixture)."""
    running = Stack(
        database_url=os.environ["DATABASE_URL"],
        redis_url=os.environ["REDIS_URL"],
        data_dir=tmp_path_factory.mktemp("stack"),
    )
    # GitHub sign-in against the stand-in, as production signs in with GitHub:
    # the web reads these at start, and the stand-in's callback must be the
    # stack's own (its port is chosen above). With a client id set, the local
    # password login is off by default, as in production; the CLI and API
    # tests are unaffected (they use API tokens from `issue_token`).
    stack_github.callback_url = f"{running.url}/auth/complete/github/"
    running.env.update(
        GITHUB_CLIENT_ID=stack_github.client_id,
        GITHUB_CLIENT_SECRET=stack_github.client_secret,
        GITHUB_URL=stack_github.url,
        GITHUB_API_URL=stack_github.api_url,
        # With GitHub sign-in and the local backend on, the server refuses to
        # start without an allowlist or with the built-in secret key: the
        # browser tests' people (tests/e2e/test_dashboard.py).
        TRAINYARD_GITHUB_ALLOW="dana,vic,ellen,frank,gina,hana,iris,june,kim,lena,tess,uma,nora,otto,pia,bram,mika,kurt,felix,lara,milo,nils",
        DJANGO_SECRET_KEY=secrets.token_urlsafe(32),
    )
    # Fast timeouts, so a dead runner is noticed in seconds, not minutes.
    running.env.update(
        TRAINYARD_HEARTBEAT_SECONDS="1",
        TRAINYARD_HEARTBEAT_TIMEOUT_SECONDS="5",
        TRAINYARD_RECONCILE_SECONDS="1",
        # Dev environments idle past a few seconds' inactivity_duration stop within a second.
        TRAINYARD_DEV_IDLE_CHECK_SECONDS="1",
        # Guards (utilization_policy, stall) fire within a second of their window.
        TRAINYARD_GUARD_CHECK_SECONDS="1",
        TRAINYARD_LOCAL_RUNNERS_MAX="4",
        # Webhook receivers the tests start listen on loopback (tests/e2e/test_notify.py).
        TRAINYARD_NOTIFY_PRIVATE_NETWORKS="127.0.0.0/8",
        # The tests' Kubernetes API servers listen on loopback (tests/support/kubeapi.py, tests/e2e/test_kubernetes.py).
        TRAINYARD_KUBERNETES_PRIVATE_NETWORKS="127.0.0.0/8",
        # Each line a test writes here drops one job acceptance (tests/e2e/test_fencing.py).
        TRAINYARD_TEST_DROP_ACCEPTANCES=str(running.data_dir / "drop-acceptances"),
        # Each line here makes the server lose one log batch it acknowledges (tests/e2e/test_log_faults.py).
        TRAINYARD_TEST_DROP_LOG_BATCHES=str(running.data_dir / "drop-log-batches"),
        # A task that notes a subject listed here kills its worker (tests/e2e/test_task_parking.py).
        TRAINYARD_TEST_CRASH_SUBJECTS=str(running.data_dir / "crash-subjects"),
    )
    moto: MotoServer = request.getfixturevalue("moto_server")
    running.env.update(moto.env)
    running.env["TRAINYARD_AWS_IDENTITY_CERTIFICATES"] = iid.certificate_pem()
    reported("stack", running)
    try:
        running.start_all()
        yield running
    finally:
        running.close()


@pytest.fixture
def web_server(transactional_db: None, tmp_path: Path) -> Iterator[WebServers]:
    """``web_server.start(**env)``: the real ASGI server on the test database (tests/support/web.py)."""
    servers = WebServers(tmp_path / "web")
    REPORTED["web_server"] = servers  # type: ignore[assignment]  # a Stack for the report: it has logs_tail()
    try:
        yield servers
    finally:
        servers.stop_all()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    """On failure of a test that uses a stack, attach the tail of each of its process logs."""
    report = yield
    if report.failed:
        for fixture, stack in REPORTED.items():
            if fixture in getattr(item, "fixturenames", ()):
                report.sections.append((f"{fixture} process logs", stack.logs_tail()))
    return report


EXIT_GRACE_SECONDS = 60.0


def pytest_unconfigure(config: pytest.Config) -> None:
    """A test that leaves a non-daemon thread blocked (an event loop stuck in
    its shutdown) holds the interpreter's exit forever: CI once waited 50
    minutes after the summary line. Give the exit a minute, then print every
    thread's stack and leave with the session's own status. Not in an xdist
    worker: it goes on serving its controller until that ends the run, and
    the controller has a watchdog of its own."""
    if hasattr(config, "workerinput"):
        return
    status = int(getattr(config, "_trainyard_exitstatus", 1))

    def leave_if_stuck() -> None:
        time.sleep(EXIT_GRACE_SECONDS)
        sys.stderr.write(
            f"\npytest finished but a thread left by a test kept the process alive for {EXIT_GRACE_SECONDS:.0f} s;"
            " its stack:\n"
        )
        faulthandler.dump_traceback(all_threads=True)
        sys.stderr.flush()
        os._exit(status)

    threading.Thread(target=leave_if_stuck, name="exit-watchdog", daemon=True).start()


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config._trainyard_exitstatus = exitstatus  # type: ignore[attr-defined]


@pytest.fixture(autouse=True)
def _a_channel_layer_per_test() -> Iterator[None]:
    """Each test gets channel layer objects of its own. channels_redis's layer
    serves receive() from one event loop at a time: a receive a test's
    event loop left pending (a follower's relay that was never disconnected)
    would make the next test's receive, in another loop, fail with "bound to
    a different event loop"."""
    from channels.layers import channel_layers

    yield
    channel_layers.backends.clear()
