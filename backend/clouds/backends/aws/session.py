"""boto3 sessions and clients for one connected AWS account.

Two ways to connect (docs/BACKENDS.md, docs/AWS.md):

- a role: ``config["role_arn"]`` and the server-generated
  ``config["external_id"]``; the server's own credentials (the default
  chain: environment, instance profile) call ``sts:AssumeRole``, and the
  session refreshes itself before the role's credentials expire;
- access keys: ``credentials["access_key_id"]`` / ``["secret_access_key"]``
  (decrypted by the caller, never logged).

Every client honours ``AWS_ENDPOINT_URL`` (boto3 reads it itself), which is
how the tests point everything at moto's server. Timeouts: connect 5 s, read
30 s. The launch client does not retry at all (botocore would retry a
capacity error inside one call); the caller retries throttling with the
same ClientToken. Other clients use botocore's standard retries.

Every session of the process reads botocore's data (service models,
endpoint rules, paginators) through one shared loader, and the worker
loads the services Trainyard calls into it before it forks its pool
(``warm``, from ``backend/config/celery.py``): without it, a new session's
first EC2 client parses EC2's model again (0.4 s of JSON).
Clients are kept per session, service, region and kind.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import boto3
from botocore import UNSIGNED
from botocore.config import Config
from botocore.credentials import RefreshableCredentials
from botocore.exceptions import DataNotFoundError
from botocore.loaders import Loader, create_loader
from botocore.session import Session as BotocoreSession
from botocore.session import get_session

from backend.clouds.backends.base import AccountConfig
from backend.clouds.backends.errors import InvalidConfig

ROLE_SESSION_SECONDS = 3600
CONNECT_TIMEOUT = 5
READ_TIMEOUT = 30
# What ``warm`` loads: every service this package calls.
WARM_SERVICES = ("ec2", "s3", "sts", "service-quotas")
WARM_REGION = "us-east-1"

_lock = threading.Lock()
_base: boto3.session.Session | None = None
_sessions: dict[tuple[str, ...], boto3.session.Session] = {}
# Per session (they go with it) and service, region, launch.
_clients: weakref.WeakKeyDictionary[boto3.session.Session, dict[tuple[str, str, bool], Any]] = (
    weakref.WeakKeyDictionary()
)
_loader: Loader | None = None
_loader_lock = threading.Lock()


@dataclass(frozen=True)
class AwsAuth:
    """How to get credentials for one account; ``repr`` shows no secret."""

    role_arn: str = ""
    external_id: str = ""
    access_key_id: str = ""
    secret_access_key: str = ""
    session_name: str = "trainyard"

    def __repr__(self) -> str:
        if self.role_arn:
            return f"AwsAuth(role_arn={self.role_arn!r})"
        return f"AwsAuth(access_key_id={self.access_key_id[:4]}…)"

    @property
    def cache_key(self) -> tuple[str, ...]:
        return (self.role_arn, self.external_id, self.access_key_id, self.secret_access_key, self.session_name)


def auth_of(account: AccountConfig) -> AwsAuth:
    """The account's way in; ``InvalidConfig`` naming what is missing."""
    role_arn = str(account.config.get("role_arn") or "")
    external_id = str(account.config.get("external_id") or "")
    key_id = account.credentials.get("access_key_id", "")
    secret = account.credentials.get("secret_access_key", "")
    session_name = f"trainyard-{account.workspace_id}"[:64]
    if role_arn:
        if len(external_id) < 2:
            raise InvalidConfig(
                "the aws account's role has no external id; reconnect it with `trainyard backend add aws --role-arn …`",
                code="MissingExternalId",
            )
        return AwsAuth(role_arn=role_arn, external_id=external_id, session_name=session_name)
    if key_id and secret:
        return AwsAuth(access_key_id=key_id, secret_access_key=secret, session_name=session_name)
    raise InvalidConfig(
        "the aws account has neither a role ARN nor access keys; connect it with "
        "`trainyard backend add aws --role-arn …` (or --access-key-id/--secret-access-key)",
        code="MissingCredentials",
    )


def base_session() -> boto3.session.Session:
    """The server's own session (default credential chain). Role accounts
    assume their role from it. Tests register botocore event hooks on it
    (``base_session().events.register(...)``): clients made later see them."""
    global _base
    with _lock:
        if _base is None:
            _base = boto3.session.Session(botocore_session=_botocore_session())
        return _base


def session_for(auth: AwsAuth) -> boto3.session.Session:
    """A session for ``auth``, built once per process; a role session
    refreshes its credentials by itself before they expire."""
    with _lock:
        session = _sessions.get(auth.cache_key)
    if session is not None:
        return session
    if auth.role_arn:
        session = _role_session(auth)
    else:
        session = boto3.session.Session(
            aws_access_key_id=auth.access_key_id,
            aws_secret_access_key=auth.secret_access_key,
            botocore_session=_botocore_session(),
        )
    with _lock:
        return _sessions.setdefault(auth.cache_key, session)


def client(auth: AwsAuth, service: str, region: str, *, launch: bool = False) -> Any:
    """A boto3 client of ``service`` in ``region``, built once per session
    (clients are thread-safe). ``launch=True``: no retries inside botocore
    (RunInstances; see the module docstring)."""
    session = session_for(auth)
    key = (service, region, launch)
    with _lock:
        found = _clients.setdefault(session, {}).get(key)
    if found is not None:
        return found
    # total_max_attempts counts the first request; botocore's max_attempts counts only retries.
    retries: dict[str, Any] = {"mode": "standard", "total_max_attempts": 1 if launch else 3}
    config = Config(connect_timeout=CONNECT_TIMEOUT, read_timeout=READ_TIMEOUT, retries=retries)
    made = session.client(service, region_name=region, config=config)
    with _lock:
        return _clients[session].setdefault(key, made)


def endpoint_client(*, endpoint_url: str, access_key_id: str, secret_access_key: str, region: str) -> Any:
    """An S3 client of an S3-compatible endpoint (MinIO, R2, Ceph…) with
    its own keys; a client with no keys signs nothing (a public bucket).
    Path-style addressing: such endpoints rarely have a DNS name per bucket."""
    session = boto3.session.Session(
        aws_access_key_id=access_key_id or None,
        aws_secret_access_key=secret_access_key or None,
        botocore_session=_botocore_session(),
    )
    config = Config(
        connect_timeout=CONNECT_TIMEOUT,
        read_timeout=READ_TIMEOUT,
        retries={"mode": "standard", "total_max_attempts": 3},
        signature_version="s3v4" if access_key_id else UNSIGNED,
        s3={"addressing_style": "path"},
    )
    return session.client("s3", region_name=region or WARM_REGION, endpoint_url=endpoint_url, config=config)


def anonymous_client(region: str) -> Any:
    """An S3 client that signs nothing: reads public buckets only."""
    config = Config(
        connect_timeout=CONNECT_TIMEOUT,
        read_timeout=READ_TIMEOUT,
        retries={"mode": "standard", "total_max_attempts": 3},
        signature_version=UNSIGNED,
    )
    session = boto3.session.Session(botocore_session=_botocore_session())
    return session.client("s3", region_name=region or WARM_REGION, config=config)


def warm(services: tuple[str, ...] = WARM_SERVICES) -> None:
    """Read botocore's data for ``services`` into the shared loader: their
    models, endpoint rules and paginators, and botocore's own endpoints and
    defaults. No network call (the throwaway session has static keys).
    Called once in the Celery worker's parent process, so that every pool
    process forked from it starts with them."""
    session = boto3.session.Session(
        aws_access_key_id="warm", aws_secret_access_key="warm", botocore_session=_botocore_session()
    )
    for service in services:
        session.client(service, region_name=WARM_REGION)
        with contextlib.suppress(DataNotFoundError):
            _shared_loader().load_service_model(service, "paginators-1")


def forget_sessions() -> None:
    """Drop cached sessions, and with them their clients (tests; an account
    whose credentials changed). The shared loader stays: it holds only botocore's data."""
    global _base
    with _lock:
        _sessions.clear()
        _base = None


def _role_session(auth: AwsAuth) -> boto3.session.Session:
    def refresh() -> dict[str, str]:
        sts = base_session().client(
            "sts",
            # STS answers in every region; without a region boto3 would refuse to make the client.
            region_name=base_session().region_name or "us-east-1",
            config=Config(connect_timeout=CONNECT_TIMEOUT, read_timeout=READ_TIMEOUT),
        )
        answer = sts.assume_role(
            RoleArn=auth.role_arn,
            RoleSessionName=auth.session_name,
            ExternalId=auth.external_id,
            DurationSeconds=ROLE_SESSION_SECONDS,
        )
        creds = answer["Credentials"]
        expiry = creds["Expiration"]
        return {
            "access_key": creds["AccessKeyId"],
            "secret_key": creds["SecretAccessKey"],
            "token": creds["SessionToken"],
            "expiry_time": expiry.isoformat() if isinstance(expiry, datetime) else str(expiry),
        }

    credentials = RefreshableCredentials.create_from_metadata(
        metadata=refresh(), refresh_using=refresh, method="sts-assume-role"
    )
    botocore_session = _botocore_session()
    botocore_session._credentials = credentials  # the documented way to hand a session refreshable credentials
    return boto3.session.Session(botocore_session=botocore_session)


def _botocore_session() -> BotocoreSession:
    session = get_session()
    session.register_component("data_loader", _shared_loader())
    return session


def _shared_loader() -> Loader:
    """One botocore loader for every session of the process: it caches what
    it reads. Its search paths are botocore's (``AWS_DATA_PATH``, then its
    defaults); boto3 appends its own data path to a session's loader each
    time a ``boto3.session.Session`` is made, which ``_PathsOnce`` keeps
    from growing the shared list."""
    global _loader
    with _loader_lock:  # not _lock: base_session holds it while it makes its session
        if _loader is None:
            paths = create_loader(get_session().get_config_variable("data_path")).search_paths
            _loader = Loader(extra_search_paths=_PathsOnce(paths), include_default_search_paths=False)
        return _loader


class _PathsOnce(list[str]):
    """A search path list that ignores a path it already has."""

    _guard = threading.Lock()

    def append(self, path: str) -> None:
        with self._guard:
            if path not in self:
                super().append(path)
