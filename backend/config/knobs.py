"""Every environment variable the server reads, declared once: its name, how
it is parsed, its default and what it does, grouped by topic.

A topic is a TypedDict whose keys are annotated ``Annotated[<type>, Knob(…)]``:
the annotation is the value's type (mypy reads ``settings.TRAINYARD["KEY"]``
from it), the ``Knob`` says which variable sets it, how, to what by default,
and why. ``Environment.read(topic)`` reads one topic into a plain dict, in key
order; a computed default sees the values read before it (by variable name).
``settings.TRAINYARD`` is ``TrainyardSettings``: the production topics and,
declared apart, the test hooks, which production refuses
(``refuse_test_hooks``). The other topics become names in settings.py.

``.env.example`` and docs/CONFIGURATION.md are generated from this module
(``python -m backend.config.knobs --write``); tests/core/test_settings_declared.py
fails when they differ from it.

No ``from __future__ import annotations`` here: each ``Annotated[…]`` is
evaluated once, when its class is made, so every ``Knob`` exists once.
"""

import argparse
import copy
import ipaddress
import json
import re
import sys
import textwrap
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, TypedDict, TypeVar

from backend.core.env import (
    ConfigError,
    env_bool,
    env_float,
    env_int,
    env_json,
    env_list,
    env_rate,
    env_str,
    env_url,
)

T = TypeVar("T")
# The values read so far, by variable name: what a computed default may use.
Values = Mapping[str, Any]

CHECKOUT = Path(__file__).resolve().parent.parent.parent
REGENERATE = ".venv/bin/python -m backend.config.knobs --write"


# --- How a variable is parsed --------------------------------------------------


@dataclass(frozen=True)
class Type:
    """How a variable's text becomes its value: ``read(name, default)``
    returns the default when the variable is unset (or empty, except for
    text). ``name`` is how the docs call the format; ``from_file``: the value
    may instead be the contents of the file named by ``<NAME>_FILE``."""

    name: str
    read: Callable[[str, Any], Any]
    from_file: bool = False


def _env_path(name: str, default: Path) -> Path:
    return Path(env_str(name, str(default)))


def _env_absolute_path(name: str, default: Path) -> Path:
    return Path(env_str(name, str(default))).resolve()


def _env_url_text(name: str, default: str) -> str:
    return env_str(name, default).rstrip("/")


def _env_seconds_or_unset(name: str, default: float | None) -> float | None:
    return env_float(name, default or 0.0) or None


def _env_log_format(name: str, default: str) -> str:
    value = env_str(name, default).strip().lower() or default
    if value not in ("plain", "json"):
        raise ConfigError(f"{name}={value!r} is not a log format: use plain or json.")
    return value


_GITHUB_NAME = re.compile(r"^(?:(org:)?[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){0,38}|id:[1-9][0-9]{0,15})$")


def _env_github_names(name: str, default: list[str]) -> list[str]:
    names = [entry.lower() for entry in env_list(name, default)]
    if bad := [entry for entry in names if not _GITHUB_NAME.match(entry)]:
        raise ConfigError(f"{name}: {bad[0]!r} is not a GitHub login, org:<organization> or id:<GitHub user id>.")
    return names


def _env_networks(name: str, default: list[str]) -> list[str]:
    networks = env_list(name, default)
    for entry in networks:
        try:
            ipaddress.ip_network(entry, strict=False)
        except ValueError:
            raise ConfigError(f"{name}: {entry!r} is not a network such as 10.20.0.0/16 or fd00::/8.") from None
    return networks


TEXT = Type("text", env_str, from_file=True)
URL_TEXT = Type("text: a URL", _env_url_text, from_file=True)
PATH = Type("path", _env_path, from_file=True)
ABSOLUTE_PATH = Type("path", _env_absolute_path, from_file=True)
LOG_FORMAT = Type("text: `plain` or `json`", _env_log_format, from_file=True)
HTTP_URL = Type("http(s) URL", env_url)
INTEGER = Type("integer", env_int)
NUMBER = Type("number", env_float)
SECONDS_OR_UNSET = Type("number (0: unset)", _env_seconds_or_unset)
BOOLEAN = Type("boolean", env_bool)
LIST = Type("comma-separated list", env_list)
GITHUB_NAMES = Type("comma-separated list", _env_github_names)
NETWORKS = Type("comma-separated list of networks (CIDR)", _env_networks)
JSON = Type("JSON", env_json)
RATE = Type("rate", env_rate)


# --- What a key is made from ---------------------------------------------------


@dataclass(frozen=True)
class Computed:
    """A default that depends on other values or on the process: ``compute``
    gets the values read so far; ``shown`` is how the docs state it."""

    compute: Callable[[Values], Any]
    shown: str


@dataclass(frozen=True)
class Knob:
    """One environment variable: ``env`` is read as ``type``, unset it is
    ``default`` (a value, or ``Computed``); ``meaning`` is one line for people."""

    env: str
    type: Type
    default: Any
    meaning: str

    def read(self, values: dict[str, Any]) -> Any:
        """The variable's value; recorded in ``values`` for later defaults."""
        # A list or dict default is copied: no two reads share one.
        computed = isinstance(self.default, Computed)
        default = self.default.compute(values) if computed else copy.deepcopy(self.default)
        values[self.env] = value = self.type.read(self.env, default)
        return value

    def knobs(self) -> tuple["Knob", ...]:
        return (self,)


@dataclass(frozen=True)
class Derived:
    """A key no variable sets: computed from values read before it."""

    compute: Callable[[Values], Any]

    def read(self, values: dict[str, Any]) -> Any:
        return self.compute(values)

    def knobs(self) -> tuple[Knob, ...]:
        return ()


@dataclass(frozen=True)
class RateLimit:
    """One scope's limits: hits per user (or per runner) and per client address."""

    scope: str
    user: Knob
    ip: Knob


@dataclass(frozen=True)
class RateLimits:
    """``{scope: {"user": (hits, seconds) | None, "ip": …}}`` from one
    variable per scope and kind (backend/core/ratelimit.py)."""

    scopes: tuple[RateLimit, ...]

    def read(self, values: dict[str, Any]) -> Any:
        return {limit.scope: {"user": limit.user.read(values), "ip": limit.ip.read(values)} for limit in self.scopes}

    def knobs(self) -> tuple[Knob, ...]:
        return tuple(knob for limit in self.scopes for knob in (limit.user, limit.ip))


Source = Knob | Derived | RateLimits


def _production(values: Values) -> bool:
    return bool(values["TRAINYARD_ENV"] == "production")


def _https(values: Values) -> bool:
    return bool(values["TRAINYARD_HTTPS"])


# --- Server-wide: names in settings.py ----------------------------------------
# Each line: KEY: Annotated[<type>, Knob(<variable>, <format>, <default>, <meaning>)].
# fmt: off


class Mode(TypedDict):
    """Development or production, and where local state lives."""

    TRAINYARD_ENV: Annotated[str, Knob(
        "TRAINYARD_ENV", TEXT, "development",
        "`production` turns unsafe defaults into start-up errors, HTTPS on and the local backend off, "
        "and refuses test hooks.",
    )]
    DATA_DIR: Annotated[Path, Knob(
        "TRAINYARD_DATA_DIR", ABSOLUTE_PATH,
        Computed(lambda _: CHECKOUT / ".trainyard-data", "`.trainyard-data` in the checkout"),
        "Local state: `make run`'s embedded Postgres and Valkey, local storage and runner wheels (by default), "
        "local runners' folders, static files; the default installation id derives from it.",
    )]


class Services(TypedDict):
    """Postgres and Redis. Unset, `make run` starts embedded ones."""

    DATABASE_URL: Annotated[str, Knob(
        "DATABASE_URL", TEXT, "",
        "Postgres, `postgresql://user:pass@host:5432/trainyard`; unset: the servers `make run` started "
        "(their URLs are in `<data dir>/embedded.env`).",
    )]
    REDIS_URL: Annotated[str, Knob(
        "REDIS_URL", TEXT, "",
        "Redis, `redis://host:6379/0`: Celery's broker, the channel layer, rate limits and metrics; "
        "unset: `make run`'s embedded Valkey.",
    )]
    DATABASE_CONN_MAX_AGE: Annotated[int, Knob(
        "DATABASE_CONN_MAX_AGE", INTEGER, 60,
        "Seconds a process keeps a database connection open (0: a new one per request); not with the pool.",
    )]
    DB_POOL: Annotated[bool, Knob(
        "TRAINYARD_DB_POOL", BOOLEAN,
        Computed(lambda _: "backend.config.asgi" in sys.modules, "on in web processes (uvicorn), off elsewhere"),
        "Pool database connections (psycopg-pool) in this process (docs/DEPLOY.md, \"Database connections\").",
    )]
    DB_POOL_MIN: Annotated[int, Knob(
        "TRAINYARD_DB_POOL_MIN", INTEGER, 2,
        "Pooled connections kept open per process.",
    )]
    DB_POOL_MAX: Annotated[int, Knob(
        "TRAINYARD_DB_POOL_MAX", INTEGER, 20,
        "At most this many pooled connections per process: size Postgres's `max_connections` for them.",
    )]
    DB_POOL_TIMEOUT: Annotated[float, Knob(
        "TRAINYARD_DB_POOL_TIMEOUT", NUMBER, 5.0,
        "Seconds a request waits for a free pooled connection, then fails.",
    )]
    CHANNEL_PREFIX: Annotated[str, Knob(
        "TRAINYARD_CHANNEL_PREFIX", TEXT, "trainyard",
        "Prefix of this installation's keys in Redis (channel layer, rate limits, metrics), "
        "so installations sharing a Redis stay apart.",
    )]
    CHANNEL_GROUP_EXPIRY_SECONDS: Annotated[int, Knob(
        "TRAINYARD_CHANNEL_GROUP_EXPIRY_SECONDS", INTEGER, 86400,
        "A follower's channel-group membership lapses unless renewed within this long (followers renew "
        "theirs every TRAINYARD_WS_RECHECK_SECONDS, at most a quarter of it).",
    )]


class Web(TypedDict):
    """The web server: its address, Django's keys and hosts, HTTPS."""

    PORT: Annotated[int, Knob(
        "TRAINYARD_PORT", INTEGER, 8000,
        "Port `make run`'s web server binds; the default TRAINYARD_PUBLIC_URL names it.",
    )]
    PUBLIC_URL: Annotated[str, Knob(
        "TRAINYARD_PUBLIC_URL", URL_TEXT,
        Computed(lambda v: f"http://127.0.0.1:{v['TRAINYARD_PORT']}", "`http://127.0.0.1:<TRAINYARD_PORT>`"),
        "How runners and browsers reach this server: the runners' API, signed links, the GitHub callback; "
        "`https://` while TRAINYARD_HTTPS is on.",
    )]
    SECRET_KEY: Annotated[str, Knob(
        "DJANGO_SECRET_KEY", TEXT, "",
        "Django's signing key (sessions, tokens): required in production and with GitHub sign-in; "
        "unset in development: a built-in key.",
    )]
    DEBUG: Annotated[bool, Knob(
        "DJANGO_DEBUG", BOOLEAN, Computed(lambda v: not _production(v), "true in development, false in production"),
        "Django's debug mode: error pages with tracebacks.",
    )]
    ALLOWED_HOSTS: Annotated[list[str], Knob(
        "DJANGO_ALLOWED_HOSTS", LIST,
        Computed(lambda v: [] if _production(v) else ["*"], "`*` in development; none in production"),
        "Host names the server answers to: required in production.",
    )]
    CSRF_TRUSTED_ORIGINS: Annotated[list[str], Knob(
        "DJANGO_CSRF_TRUSTED_ORIGINS", LIST, [],
        "Other origins (`https://host`, `https://*.example.com`) trusted with cookie-authenticated writes "
        "and websockets, besides TRAINYARD_PUBLIC_URL's.",
    )]
    HTTPS: Annotated[bool, Knob(
        "TRAINYARD_HTTPS", BOOLEAN, Computed(_production, "on in production, off in development"),
        "Served over HTTPS, directly or by a TLS-terminating proxy: secure-only cookies, plain HTTP "
        "redirected, HSTS; TRAINYARD_PUBLIC_URL must then be `https://`.",
    )]
    SECURE_HSTS_SECONDS: Annotated[int, Knob(
        "TRAINYARD_HSTS_SECONDS", INTEGER,
        Computed(lambda v: 31_536_000 if _https(v) else 0, "31536000 with TRAINYARD_HTTPS, else 0"),
        "Strict-Transport-Security max-age (0: no header).",
    )]
    SECURE_HSTS_PRELOAD: Annotated[bool, Knob(
        "TRAINYARD_HSTS_PRELOAD", BOOLEAN, False,
        "Add `preload` to HSTS: only for a domain you will submit to the browsers' preload list.",
    )]
    PROXY_SSL_HEADER: Annotated[str, Knob(
        "TRAINYARD_PROXY_SSL_HEADER", TEXT,
        Computed(
            lambda v: "X-Forwarded-Proto" if _https(v) else "", "`X-Forwarded-Proto` with TRAINYARD_HTTPS, else empty"
        ),
        "The header a TLS-terminating proxy sets to `https` (and overwrites); empty: trust only the "
        "connection itself.",
    )]
    APPS_URL: Annotated[str, Knob(
        "TRAINYARD_APPS_URL", URL_TEXT,
        Computed(
            lambda v: "" if _production(v) or _https(v) else f"http://{{app}}.apps.localhost:{v['TRAINYARD_PORT']}",
            "`http://{app}.apps.localhost:<TRAINYARD_PORT>` in development over plain HTTP; empty in production and"
            " over HTTPS (the apps' domain needs a certificate of its own)",
        ),
        "Where jobs' web apps (their ports) open in the browser: a URL whose first host label is `{app}`, "
        "e.g. `https://{app}.apps.example.com` (a wildcard DNS name and certificate, docs/DEPLOY.md); each app "
        "gets an origin of its own, never the dashboard's. Empty: apps are not served.",
    )]


class Operations(TypedDict):
    """What operators watch: the server's logs and its Prometheus metrics (docs/DEPLOY.md)."""

    LOG_LEVEL: Annotated[str, Knob(
        "TRAINYARD_LOG_LEVEL", TEXT, "INFO",
        "Level of the root logger: DEBUG, INFO, WARNING, ERROR.",
    )]
    LOG_FORMAT: Annotated[str, Knob(
        "TRAINYARD_LOG_FORMAT", LOG_FORMAT, "plain",
        "`plain` (LEVEL logger: message) or `json`: one JSON object per line, the web server's own lines too.",
    )]
    METRICS_TOKEN: Annotated[str, Knob(
        "TRAINYARD_METRICS_TOKEN", TEXT, "",
        "Prometheus metrics at /metrics for `Authorization: Bearer <token>`; unset: /metrics answers 404.",
    )]


class SignIn(TypedDict):
    """Who may sign in, and how: GitHub (an OAuth app) or the local password login."""

    GITHUB_CLIENT_ID: Annotated[str, Knob(
        "GITHUB_CLIENT_ID", TEXT, "",
        "A GitHub OAuth app's client id, for GitHub sign-in; its callback URL is "
        "`<TRAINYARD_PUBLIC_URL>/auth/complete/github/`.",
    )]
    GITHUB_CLIENT_SECRET: Annotated[str, Knob(
        "GITHUB_CLIENT_SECRET", TEXT, "",
        "That app's client secret: set both or neither.",
    )]
    GITHUB_URL: Annotated[str, Knob(
        "GITHUB_URL", HTTP_URL, "https://github.com",
        "GitHub's web address (GitHub Enterprise: `https://ghe.example.com`).",
    )]
    GITHUB_API_URL: Annotated[str, Knob(
        "GITHUB_API_URL", HTTP_URL, "https://api.github.com",
        "GitHub's API (GitHub Enterprise: `https://ghe.example.com/api/v3`).",
    )]
    TRAINYARD_LOCAL_LOGIN: Annotated[bool, Knob(
        "TRAINYARD_LOCAL_LOGIN", BOOLEAN,
        Computed(lambda v: not v["GITHUB_CLIENT_ID"], "on without a GitHub app, off with one"),
        "Password login for the local user `admin`; off, it neither signs in nor keeps a session alive.",
    )]
    TRAINYARD_GITHUB_ALLOW: Annotated[list[str], Knob(
        "TRAINYARD_GITHUB_ALLOW", GITHUB_NAMES, [],
        "Who may sign in with GitHub: logins, `id:<GitHub user id>` (stays theirs when GitHub gives a "
        "freed login to someone else) and `org:<organization>` (its active members), e.g. "
        "`alice,id:583231,org:acme`; empty: everyone. Required with a GitHub app while the local backend is on. "
        "Re-checked for every account each TRAINYARD_GITHUB_ALLOW_RECHECK_SECONDS.",
    )]
    TRAINYARD_GITHUB_ALLOW_RECHECK_SECONDS: Annotated[float, Knob(
        "TRAINYARD_GITHUB_ALLOW_RECHECK_SECONDS", NUMBER, 3600.0,
        "How often every GitHub account is checked against TRAINYARD_GITHUB_ALLOW again (organization "
        "membership asked of GitHub with the account's token of its last sign-in): one no longer allowed is "
        "signed out and its API tokens refused within this time, until a sign-in the allowlist lets through.",
    )]


# --- settings.TRAINYARD: production knobs ---------------------------------------


class Access(TypedDict):
    """Accounts, secrets at rest and what the API lets through."""

    SECRET_KEYS: Annotated[list[str], Knob(
        "TRAINYARD_SECRET_KEYS", LIST, [],
        "Fernet keys for secrets at rest, newest first: the first encrypts, all decrypt (`manage.py "
        "rotate_secret_keys` re-encrypts). Required in production; unset, one derives from DJANGO_SECRET_KEY.",
    )]
    MAX_WORKSPACES_PER_USER: Annotated[int, Knob(
        "TRAINYARD_MAX_WORKSPACES_PER_USER", INTEGER, 10,
        "Team workspaces one user may create (each has its own storage quota), besides their personal "
        "one; installation admins (superusers) are exempt. 0: no cap. One more is refused with 403.",
    )]
    API_TOKEN_DAYS: Annotated[float, Knob(
        "TRAINYARD_API_TOKEN_DAYS", NUMBER, 90.0,
        "A new API token whose creator names no lifetime expires after this many days (`never` names "
        "none). 0: such tokens never expire.",
    )]
    DEVICE_LOGIN_TOKEN_DAYS: Annotated[float, Knob(
        "TRAINYARD_DEVICE_LOGIN_TOKEN_DAYS", NUMBER, 30.0,
        "The API token `trainyard login` gets through the browser (a device code) expires after this many "
        "days (at least one minute; fractions allowed); the person then runs `trainyard login` again.",
    )]
    DEVICE_LOGIN_CODE_SECONDS: Annotated[int, Knob(
        "TRAINYARD_DEVICE_LOGIN_CODE_SECONDS", INTEGER, 600,
        "Seconds the code `trainyard login` shows may be approved on the dashboard (at least 60); after that "
        "the CLI is told it expired.",
    )]
    INVITATION_DAYS: Annotated[float, Knob(
        "TRAINYARD_INVITATION_DAYS", NUMBER, 7.0,
        "A workspace invitation not taken up within this many days is void (inviting again renews it).",
    )]
    WS_RECHECK_SECONDS: Annotated[float, Knob(
        "TRAINYARD_WS_RECHECK_SECONDS", NUMBER, 30.0,
        "An open browser or CLI websocket re-checks its token or session, the account and the membership "
        "this often, and is closed once one is gone.",
    )]
    UNAUTHENTICATED_BODY_BYTES: Annotated[int, Knob(
        "TRAINYARD_UNAUTHENTICATED_BODY_BYTES", INTEGER, 64 * 1024,
        "A request without a valid token or session whose body is larger is refused (413) before the body "
        "is read.",
    )]
    MAX_BODY_BYTES: Annotated[int, Knob(
        "TRAINYARD_MAX_BODY_BYTES", INTEGER, 1024 * 1024,
        "Largest request body of a route not named below (JSON and form requests), from anyone: a larger "
        "Content-Length is refused (413) before the body is read, a chunked body is cut off there.",
    )]
    MAX_MANIFEST_BODY_BYTES: Annotated[int, Knob(
        "TRAINYARD_MAX_MANIFEST_BODY_BYTES", INTEGER, 64 * 1024 * 1024,
        "Largest request body of a run submission or plan (`POST …/runs/`, `…/runs/plan/`: workflow files "
        "inline) and of a runner's file manifests (`…/artifacts/`, `…/checkpoints/`, `…/caches/`, "
        "`…/parts/`: up to 100,000 files). Code uploads are capped by TRAINYARD_MAX_BLOB_BYTES.",
    )]
    MAX_JOBS_PER_RUN: Annotated[int, Knob(
        "TRAINYARD_MAX_JOBS_PER_RUN", INTEGER, 1000,
        "Most jobs one run may have: a submission or plan with more is refused (400) before anything is "
        "written. A workflows file holds at most 1,000 workflows (fixed, checked by the CLI too).",
    )]
    WS_PER_USER: Annotated[int, Knob(
        "TRAINYARD_WS_PER_USER", INTEGER, 50,
        "Browser and CLI websockets one user may have open at once, across every web process; the one over "
        "is closed with 4429 and the limit in its reason (0: no limit).",
    )]
    RUNS_EXACT_COUNT_UP_TO: Annotated[int, Knob(
        "TRAINYARD_RUNS_EXACT_COUNT_UP_TO", INTEGER, 1000,
        "The runs list counts its matches exactly up to this many; above, it gives the planner's estimate "
        "and says so (`count_estimated`).",
    )]


class RateLimitSettings(TypedDict):
    """Rate limits per user and per client address, counted in Redis by every
    web process together; over one, the API answers 429 with Retry-After and a
    websocket closes with 4429. A rate is `N/period` (`20/min`, `100/hour`,
    `5/30s`, `5/15min`) or `off`. Sign-in lockouts count wrong passwords only:
    that many within the period lock the username (or the address) out of
    password sign-in for TRAINYARD_LOGIN_LOCKOUT_SECONDS."""

    RATE_LIMITS: Annotated[dict[str, dict[str, tuple[int, int] | None]], RateLimits((
        RateLimit(
            "login",
            Knob("TRAINYARD_RATE_LOGIN_USER", RATE, "20/min", "Password logins per username tried."),
            Knob("TRAINYARD_RATE_LOGIN_IP", RATE, "60/min", "Password logins and GitHub sign-in starts per address."),
        ),
        RateLimit(
            "token",
            Knob("TRAINYARD_RATE_TOKEN_USER", RATE, "20/min", "API tokens made and SSH keys added per user."),
            Knob("TRAINYARD_RATE_TOKEN_IP", RATE, "60/min", "API tokens made and SSH keys added per address."),
        ),
        RateLimit(
            "device",
            Knob(
                "TRAINYARD_RATE_DEVICE_USER", RATE, "20/min",
                "Device codes (`trainyard login` in the browser) looked up, approved or denied per user.",
            ),
            Knob(
                "TRAINYARD_RATE_DEVICE_IP", RATE, "60/min",
                "Device codes started by `trainyard login`, and looked up, approved or denied, per address.",
            ),
        ),
        RateLimit(
            "run",
            Knob("TRAINYARD_RATE_RUN_USER", RATE, "120/min", "Runs submitted and re-run per user."),
            Knob("TRAINYARD_RATE_RUN_IP", RATE, "600/min", "Runs submitted and re-run per address."),
        ),
        RateLimit(
            "blob",
            Knob("TRAINYARD_RATE_BLOB_USER", RATE, "120/min", "Code archives and patches uploaded per user."),
            Knob("TRAINYARD_RATE_BLOB_IP", RATE, "600/min", "Code archives and patches uploaded per address."),
        ),
        RateLimit(
            "plan",
            Knob("TRAINYARD_RATE_PLAN_USER", RATE, "120/min", "Dry-run plans per user."),
            Knob("TRAINYARD_RATE_PLAN_IP", RATE, "600/min", "Dry-run plans per address."),
        ),
        RateLimit(
            "logsearch",
            Knob("TRAINYARD_RATE_LOGSEARCH_USER", RATE, "120/min", "Log searches per user."),
            Knob("TRAINYARD_RATE_LOGSEARCH_IP", RATE, "600/min", "Log searches per address."),
        ),
        RateLimit(
            "rawlog",
            Knob(
                "TRAINYARD_RATE_RAWLOG_USER", RATE, "300/min",
                "Raw log reads and downloads per user (`trainyard logs` reads one per job).",
            ),
            Knob("TRAINYARD_RATE_RAWLOG_IP", RATE, "1200/min", "Raw log reads and downloads per address."),
        ),
        RateLimit(
            "archive",
            Knob("TRAINYARD_RATE_ARCHIVE_USER", RATE, "30/min", "Zip archives of artifacts asked for per user."),
            Knob(
                "TRAINYARD_RATE_ARCHIVE_IP", RATE, "150/min",
                "Zip archives of artifacts asked for, and archive links opened, per address.",
            ),
        ),
        RateLimit(
            "ws",
            Knob("TRAINYARD_RATE_WS_USER", RATE, "240/min", "Browser and CLI websocket connects per user."),
            Knob("TRAINYARD_RATE_WS_IP", RATE, "1200/min", "Browser and CLI websocket connects per address."),
        ),
        RateLimit(
            "runner",
            Knob("TRAINYARD_RATE_RUNNER_USER", RATE, "60/min", "Runner websocket connects per runner (its token)."),
            Knob(
                "TRAINYARD_RATE_RUNNER_IP", RATE, "120/min",
                "Runner connects with a refused token per address (runners behind one NAT are never limited).",
            ),
        ),
    ))]
    # Sign-in lockouts (backend/accounts/services/lockout.py): wrong passwords, not requests.
    LOGIN_LOCKOUT_USER: Annotated[tuple[int, int] | None, Knob(
        "TRAINYARD_LOGIN_LOCKOUT_USER", RATE, "5/15min",
        "Wrong passwords for one username (from any address) that lock that username out; `off`: never.",
    )]
    LOGIN_LOCKOUT_IP: Annotated[tuple[int, int] | None, Knob(
        "TRAINYARD_LOGIN_LOCKOUT_IP", RATE, "5/15min",
        "Wrong passwords from one address (for any usernames) that lock that address out; `off`: never.",
    )]
    LOGIN_LOCKOUT_SECONDS: Annotated[int, Knob(
        "TRAINYARD_LOGIN_LOCKOUT_SECONDS", INTEGER, 900,
        "How long a sign-in lockout lasts: every password sign-in of that username or address is refused "
        "(429), the right password too. Admins see lockouts, and lift them, in the Django admin.",
    )]
    RATE_LIMIT_PREFIX: Annotated[str, Derived(lambda v: v["TRAINYARD_CHANNEL_PREFIX"] + ":ratelimit")]


class Storage(TypedDict):
    """Where artifacts, checkpoints, caches and code blobs are kept, and how much."""

    STORAGE: Annotated[str, Knob(
        "TRAINYARD_STORAGE", TEXT, "local",
        "The installation's own storage: `local`, files under TRAINYARD_STORAGE_DIR (the only kind); a "
        "workspace whose AWS connection names a bucket keeps its new objects there (docs/STORAGE.md).",
    )]
    STORAGE_DIR: Annotated[Path, Knob(
        "TRAINYARD_STORAGE_DIR", PATH,
        Computed(lambda v: v["TRAINYARD_DATA_DIR"] / "storage", "`<TRAINYARD_DATA_DIR>/storage`"),
        "Folder of the local storage: every web process and worker must see the same one.",
    )]
    MAX_BLOB_BYTES: Annotated[int, Knob(
        "TRAINYARD_MAX_BLOB_BYTES", INTEGER, 512 * 1024 * 1024,
        "Largest code archive or patch accepted; GET /api/v1/health/ says it, so `trainyard run` refuses a "
        "larger one before uploading it.",
    )]
    STORAGE_QUOTA_BYTES: Annotated[int, Knob(
        "TRAINYARD_STORAGE_QUOTA_BYTES", INTEGER, 1 << 40,
        "Bytes a workspace may keep stored (artifacts, checkpoints, caches, code; 0: no quota); a "
        "workspace's own storage_quota_bytes wins. An upload that would go over is refused with 413.",
    )]
    SIGNED_URL_SECONDS: Annotated[int, Knob(
        "TRAINYARD_SIGNED_URL_SECONDS", INTEGER, 900,
        "Lifetime of a local-storage upload or download link, unless the caller asks for another.",
    )]
    S3_URL_SECONDS: Annotated[int, Knob(
        "TRAINYARD_S3_URL_SECONDS", INTEGER, 900,
        "Longest lifetime of an S3 presigned URL; never above 900 s nor what is left of the signing "
        "credentials.",
    )]
    MULTIPART_THRESHOLD: Annotated[int, Knob(
        "TRAINYARD_MULTIPART_THRESHOLD", INTEGER, 64 * 1024 * 1024,
        "Files larger than this go to S3 in parts.",
    )]
    MULTIPART_PART_SIZE: Annotated[int, Knob(
        "TRAINYARD_MULTIPART_PART_SIZE", INTEGER, 64 * 1024 * 1024,
        "Size of those parts, in whole MiB, at least 5 MiB, and larger for a file that would need more "
        "than 10,000.",
    )]
    GC_EVERY_SECONDS: Annotated[float, Knob(
        "TRAINYARD_GC_EVERY_SECONDS", NUMBER, 3600.0,
        "How often storage garbage collection runs (Celery beat's `storage-gc`).",
    )]
    GC_GRACE_SECONDS: Annotated[float, Knob(
        "TRAINYARD_GC_GRACE_SECONDS", NUMBER, 7 * 86400.0,
        "It deletes an unreferenced blob, an abandoned upload or a stale temporary file only once it is "
        "older than this.",
    )]
    DATA_PRIVATE_NETWORKS: Annotated[list[str], Knob(
        "TRAINYARD_DATA_PRIVATE_NETWORKS", NETWORKS, [],
        "Networks an `https://` data input's host may resolve to although they are not public, for datasets "
        "on an internal web server (`10.20.0.0/16`; `0.0.0.0/0,::/0` allows every address). Empty: the "
        "server reads only URLs whose every address is public, so a workflow cannot make it probe its own "
        "network (loopback, private, link-local such as the cloud metadata address, …).",
    )]
    EXPORT_ATTEMPTS: Annotated[int, Knob(
        "TRAINYARD_EXPORT_ATTEMPTS", INTEGER, 5,
        "Attempts at copying an artifact to its `to:` destination before it is shown failed.",
    )]
    EXPORT_RETRY_SECONDS: Annotated[float, Knob(
        "TRAINYARD_EXPORT_RETRY_SECONDS", NUMBER, 30.0,
        "Wait before the second attempt at an artifact's copy; each later wait is 4 times the one before "
        "(at most an hour).",
    )]
    EXPORT_SWEEP_SECONDS: Annotated[float, Knob(
        "TRAINYARD_EXPORT_SWEEP_SECONDS", NUMBER, 15.0,
        "How often Celery beat's `artifact-exports-sweep` sends the copies that are due (retries, and those "
        "a worker dropped).",
    )]


class Email(TypedDict):
    """Email: where Django's email backend sends (notifications by email)."""

    EMAIL_HOST: Annotated[str, Knob(
        "TRAINYARD_EMAIL_HOST", TEXT, "",
        "SMTP server that sends notification emails. Empty: email subscriptions are refused.",
    )]
    EMAIL_PORT: Annotated[int, Knob(
        "TRAINYARD_EMAIL_PORT", INTEGER, 587,
        "Its port.",
    )]
    EMAIL_HOST_USER: Annotated[str, Knob(
        "TRAINYARD_EMAIL_USER", TEXT, "",
        "User name to sign in to it (empty: no sign-in).",
    )]
    EMAIL_HOST_PASSWORD: Annotated[str, Knob(
        "TRAINYARD_EMAIL_PASSWORD", TEXT, "",
        "That user's password.",
    )]
    EMAIL_USE_TLS: Annotated[bool, Knob(
        "TRAINYARD_EMAIL_TLS", BOOLEAN, True,
        "STARTTLS before signing in and sending.",
    )]
    DEFAULT_FROM_EMAIL: Annotated[str, Knob(
        "TRAINYARD_EMAIL_FROM", TEXT, "trainyard@localhost",
        "The sender of notification emails.",
    )]


class Sessions(TypedDict):
    """Sessions into a running job: SSH, terminals and ports through the relay (docs/ACCESS.md)."""

    SESSIONS_PER_USER: Annotated[int, Knob(
        "TRAINYARD_SESSIONS_PER_USER", INTEGER, 20,
        "Live sessions one user may hold at once, in all workspaces; a grant past it is refused (429).",
    )]
    APP_STREAMS_PER_USER: Annotated[int, Knob(
        "TRAINYARD_APP_STREAMS_PER_USER", INTEGER, 64,
        "Connections the apps proxy may hold into jobs for one user at once (a browser tab on a job's web app"
        " holds several); counted apart from TRAINYARD_SESSIONS_PER_USER.",
    )]
    SESSIONS_PER_JOB: Annotated[int, Knob(
        "TRAINYARD_SESSIONS_PER_JOB", INTEGER, 128,
        "Live sessions into one job at once; a grant past it is refused (429).",
    )]
    SESSION_IDLE_SECONDS: Annotated[float, Knob(
        "TRAINYARD_SESSION_IDLE_SECONDS", NUMBER, 1800.0,
        "A session that moved no byte for this long is ended.",
    )]
    TERMINAL_GRACE: Annotated[float, Knob(
        "TRAINYARD_TERMINAL_GRACE", NUMBER, 30.0,
        "A terminal whose client's socket dropped keeps its shell this long for the client to reconnect.",
    )]


class Jobs(TypedDict):
    """Files a running job moves: checkpoints, mounted artifacts, inputs; dev environments' idle time."""

    CHECKPOINT_SYNC_SECONDS: Annotated[float, Knob(
        "TRAINYARD_CHECKPOINT_SYNC_SECONDS", NUMBER, 300.0,
        "The runner uploads a job's `checkpoint:` path this often, when it changed.",
    )]
    CHECKPOINT_KEEP: Annotated[int, Knob(
        "TRAINYARD_CHECKPOINT_KEEP", INTEGER, 3,
        "Complete checkpoint versions kept per job; older ones are pruned.",
    )]
    MOUNT_SYNC_SECONDS: Annotated[float, Knob(
        "TRAINYARD_MOUNT_SYNC_SECONDS", NUMBER, 10.0,
        "The runner uploads an artifact with `mount: true` this often while the job runs, when it changed.",
    )]
    INPUT_PAGE_FILES: Annotated[int, Knob(
        "TRAINYARD_INPUT_PAGE_FILES", INTEGER, 1000,
        "Files per page of an input's manifest, which the runner reads page by page.",
    )]
    DEV_INACTIVITY_SECONDS: Annotated[int, Knob(
        "TRAINYARD_DEV_INACTIVITY_SECONDS", INTEGER, 3600,
        "A dev environment (`provider: code`, `lab`, `notebook`) with no session into it for this long is "
        "stopped, unless its workflow's `inactivity_duration` says otherwise.",
    )]
    DEV_IDLE_CHECK_SECONDS: Annotated[float, Knob(
        "TRAINYARD_DEV_IDLE_CHECK_SECONDS", NUMBER, 30.0,
        "How often Celery beat looks for dev environments idle past their `inactivity_duration`.",
    )]


class Logs(TypedDict):
    """Jobs' logs: pages, caps, retention and archive (docs/LOGS.md)."""

    LOG_PAGE_BYTES: Annotated[int, Knob(
        "TRAINYARD_LOG_PAGE_BYTES", INTEGER, 4 << 20,
        "Most bytes of log text in one page (REST, a follower's catch-up); a page holds at least one line.",
    )]
    LOG_SEARCH_BYTES: Annotated[int, Knob(
        "TRAINYARD_LOG_SEARCH_BYTES", INTEGER, 64 << 20,
        "Most bytes of log one search reads; past it the answer says `partial` and where it stopped, and "
        "the viewer searches on from there when asked.",
    )]
    LOG_CAP_BYTES: Annotated[int, Knob(
        "TRAINYARD_LOG_CAP_BYTES", INTEGER, 1 << 30,
        "Most bytes of output a job stores unless its workspace sets its own cap; then one marker line.",
    )]
    LOG_RETENTION_DAYS: Annotated[int, Knob(
        "TRAINYARD_LOG_RETENTION_DAYS", INTEGER, 90,
        "Finished runs' logs are deleted this many days after the job ended (0: kept).",
    )]
    LOG_ARCHIVE_AFTER_SECONDS: Annotated[float, Knob(
        "TRAINYARD_LOG_ARCHIVE_AFTER_SECONDS", NUMBER, 120.0,
        "A finished job's log is compacted into one object in its workspace's storage this long after it "
        "ended (0: never).",
    )]


class JobMetrics(TypedDict):
    """Jobs' system samples and training values (docs/METRICS.md)."""

    METRICS_RAW_HOURS: Annotated[float, Knob(
        "TRAINYARD_METRICS_RAW_HOURS", NUMBER, 6.0,
        "A job's system samples are kept as sampled this many hours, then as min/mean/max per minute.",
    )]
    METRICS_COMPACT_SECONDS: Annotated[float, Knob(
        "TRAINYARD_METRICS_COMPACT_SECONDS", NUMBER, 60.0,
        "How often Celery beat packs the metrics frames received into blocks and downsamples old ones.",
    )]


class Scheduling(TypedDict):
    """The reconciler, job assignment and the Celery tasks behind them."""

    RECONCILE_SECONDS: Annotated[float, Knob(
        "TRAINYARD_RECONCILE_SECONDS", NUMBER, 2.0,
        "How often Celery beat runs the reconciler (leases, silent runners, timeouts, idle machines).",
    )]
    GUARD_CHECK_SECONDS: Annotated[float, Knob(
        "TRAINYARD_GUARD_CHECK_SECONDS", NUMBER, 15.0,
        "How often Celery beat looks at the running jobs with a guard (`utilization_policy`, `stall`): a "
        "guard fires at most this long after its window or timeout.",
    )]
    BUDGET_CHECK_SECONDS: Annotated[float, Knob(
        "TRAINYARD_BUDGET_CHECK_SECONDS", NUMBER, 15.0,
        "How often Celery beat checks the budgets over the running jobs (docs/COST.md). A budget is acted "
        "on once what it spent plus this long at the running machines' rate reaches it; keep it well under "
        "60 s, so that a stop never overshoots by more than one billing minute of the running set.",
    )]
    ASSIGN_ON_SUBMIT: Annotated[bool, Knob(
        "TRAINYARD_ASSIGN_ON_SUBMIT", BOOLEAN, True,
        "A submitted job an idle runner fits is assigned in the submission's own request (false: every "
        "job waits for a scheduling pass).",
    )]
    ASSIGN_ON_IDLE: Annotated[bool, Knob(
        "TRAINYARD_ASSIGN_ON_IDLE", BOOLEAN, True,
        "A runner that finished a job, or said hello, takes the oldest pending job it fits at once "
        "(false: it waits for a pass).",
    )]
    SCHEDULE_MAX_PASSES: Annotated[int, Knob(
        "TRAINYARD_SCHEDULE_MAX_PASSES", INTEGER, 20,
        "One schedule task runs at most this many passes in a row while requests keep coming, then hands "
        "over to a fresh task.",
    )]
    TASK_MAX_DELIVERIES: Annotated[int, Knob(
        "TRAINYARD_TASK_MAX_DELIVERIES", INTEGER, 3,
        "A task whose worker died this many times under it is parked (core_parkedtask), not run again.",
    )]
    DB_CONFLICT_RETRIES: Annotated[int, Knob(
        "TRAINYARD_DB_CONFLICT_RETRIES", INTEGER, 5,
        "A transaction that lost a deadlock or serialization race is run again at most this many times.",
    )]


class Runners(TypedDict):
    """How the server keeps in touch with runners, and the machines that boot one."""

    HEARTBEAT_SECONDS: Annotated[float, Knob(
        "TRAINYARD_HEARTBEAT_SECONDS", NUMBER, 2.0,
        "How often a runner sends a heartbeat (the server tells it when it connects).",
    )]
    HEARTBEAT_TIMEOUT_SECONDS: Annotated[float, Knob(
        "TRAINYARD_HEARTBEAT_TIMEOUT_SECONDS", NUMBER, 15.0,
        "A runner silent this long is unreachable, and its backend is asked whether the machine is still there.",
    )]
    UNREACHABLE_GRACE_SECONDS: Annotated[float | None, Knob(
        "TRAINYARD_UNREACHABLE_GRACE_SECONDS", SECONDS_OR_UNSET, None,
        "An unreachable runner whose machine is still there keeps its job this long, then it is fenced; "
        "unset: its backend's own (120 s for every built-in one).",
    )]
    LEASE_SECONDS: Annotated[float, Knob(
        "TRAINYARD_LEASE_SECONDS", NUMBER, 15.0,
        "A runner must accept an assigned job within this long, or the job is offered to another.",
    )]
    STOP_GRACE_SECONDS: Annotated[float, Knob(
        "TRAINYARD_STOP_GRACE_SECONDS", NUMBER, 100.0,
        "A runner must confirm a stop within this long, or the server ends the attempt itself; longer than "
        "the runner's ack and drain timeouts (30 + 60 s).",
    )]
    PROVISION_TIMEOUT_SECONDS: Annotated[float, Knob(
        "TRAINYARD_PROVISION_TIMEOUT_SECONDS", NUMBER, 60.0,
        "A started local runner that has not said hello within this long is given up (cloud backends "
        "have their own timeouts).",
    )]
    RUNNER_WHEELHOUSE: Annotated[Path, Knob(
        "TRAINYARD_RUNNER_WHEELHOUSE", PATH,
        Computed(lambda v: v["TRAINYARD_DATA_DIR"] / "runner-wheels", "`<TRAINYARD_DATA_DIR>/runner-wheels`"),
        "Where the runner wheels that machines booting from an image install (/runner/wheels/) are made "
        "once; `manage.py runner_wheels` makes them ahead.",
    )]
    RUNNER_MAX_LIFETIME_SECONDS: Annotated[float, Knob(
        "TRAINYARD_RUNNER_MAX_LIFETIME_SECONDS", NUMBER, 7 * 86400.0,
        "A machine booted from an image powers itself off this long after it started, whatever it runs "
        "(0: never).",
    )]
    RUNNER_POWER_OFF_AFTER_SECONDS: Annotated[float, Knob(
        "TRAINYARD_RUNNER_POWER_OFF_AFTER_SECONDS", NUMBER, 1800.0,
        "Such a machine powers itself off after this long idle without the server (0: never).",
    )]


class Backends(TypedDict):
    """The machines this server starts in clouds, and the backends that start them."""

    INSTALLATION: Annotated[str, Knob(
        "TRAINYARD_INSTALLATION", TEXT, "",
        "Tag on every machine this server starts; the leak sweep terminates only machines with it. Unset: "
        "derived from the data dir; set one value everywhere when processes run on several hosts.",
    )]
    AWS_PRINCIPAL_ARN: Annotated[str, Knob(
        "TRAINYARD_AWS_PRINCIPAL_ARN", TEXT, "",
        "The role or user this server runs as in AWS, which workspaces' roles trust (docs/AWS.md).",
    )]
    AWS_IDENTITY_CERTIFICATES: Annotated[str, Knob(
        "TRAINYARD_AWS_IDENTITY_CERTIFICATES", TEXT, "",
        "PEM certificates that sign EC2 instance identity documents (RSA-2048), which a runner on an EC2 "
        "machine must present. Unset: AWS's published RSA-2048 certificates of 31 regions, shipped in "
        "backend/clouds/backends/aws/identity_certificates.pem; set it for a region not listed there.",
    )]
    BACKEND_KINDS: Annotated[dict[str, str], Knob(
        "TRAINYARD_BACKEND_KINDS", JSON, {},
        "More backend kinds, `{\"kind\": \"package.module:ComputeClass\"}`.",
    )]
    WARM_BACKENDS: Annotated[bool, Knob(
        "TRAINYARD_WARM_BACKENDS", BOOLEAN, True,
        "The Celery worker loads every backend's SDK data (botocore's models) before it forks its pool.",
    )]
    FACTS_REFRESH_SECONDS: Annotated[float, Knob(
        "TRAINYARD_FACTS_REFRESH_SECONDS", NUMBER, 600.0,
        "An account's facts (zones, offerings, spot prices, quotas) are asked for again once this old.",
    )]
    KUBERNETES_PRIVATE_NETWORKS: Annotated[list[str], Knob(
        "TRAINYARD_KUBERNETES_PRIVATE_NETWORKS", NETWORKS, [],
        "Networks a Kubernetes backend's API server may lie in besides public addresses (e.g. a cluster "
        "beside the server at 10.0.0.0/8). Unset: only API servers at public addresses can be connected.",
    )]
    KUBERNETES_IN_CLUSTER: Annotated[bool, Knob(
        "TRAINYARD_KUBERNETES_IN_CLUSTER", BOOLEAN, False,
        "Kubernetes backends may use the server's own service account (`in_cluster`) instead of a "
        "kubeconfig: only where every workspace may run pods in the server's own cluster.",
    )]
    LEAK_SWEEP_SECONDS: Annotated[float, Knob(
        "TRAINYARD_LEAK_SWEEP_SECONDS", NUMBER, 60.0,
        "How often backends are asked for machines with our tag and no live row (the leak sweep).",
    )]
    LEAK_MIN_AGE_SECONDS: Annotated[float, Knob(
        "TRAINYARD_LEAK_MIN_AGE_SECONDS", NUMBER, 600.0,
        "Such a machine is terminated only once it is this old.",
    )]


class LocalBackend(TypedDict):
    """Runner processes on the server's own host. Local jobs run as the server's
    OS user: for one trusted user only."""

    LOCAL_BACKEND_ENABLED: Annotated[bool, Knob(
        "TRAINYARD_LOCAL_BACKEND", BOOLEAN,
        Computed(lambda v: not _production(v), "on in development, off in production"),
        "Every workspace gets the shared `local` backend.",
    )]
    SINGLE_TENANT: Annotated[bool, Knob(
        "TRAINYARD_SINGLE_TENANT", BOOLEAN, False,
        "The installation's users trust each other (one person or one team): production allows the local "
        "backend only then, since local jobs run as the server's user and can read its environment and files.",
    )]
    LOCAL_RUNNERS_MAX: Annotated[int, Knob(
        "TRAINYARD_LOCAL_RUNNERS_MAX", INTEGER, 4,
        "Local runners alive at once, shared by all workspaces.",
    )]
    LOCAL_RUNNER_IDLE_SECONDS: Annotated[float, Knob(
        "TRAINYARD_LOCAL_RUNNER_IDLE_SECONDS", NUMBER, 300.0,
        "An idle local runner is retired after this long, unless its last job's workflow says otherwise.",
    )]
    LOCAL_RUNNER_COMMAND: Annotated[str, Knob(
        "TRAINYARD_LOCAL_RUNNER_COMMAND", TEXT, "",
        "Command that starts a local runner, split like a shell; unset: `<server python> -m trainyard_runner`.",
    )]
    LOCAL_SHAPES: Annotated[list[dict[str, Any]], Knob(
        "TRAINYARD_LOCAL_SHAPES", JSON, [],
        "Machine shapes the local backend offers instead of this host (for tests): a JSON list of objects "
        "with `name`, `cpus`, `memory_bytes`, `disk_bytes` and `gpus` (`[{\"name\": \"A10G\"}]`).",
    )]


# --- settings.TRAINYARD: test hooks, refused in production ------------------------


class Notifications(TypedDict):
    """Notifications: webhooks, Slack and email about runs (docs/COST.md)."""

    NOTIFY_PRIVATE_NETWORKS: Annotated[list[str], Knob(
        "TRAINYARD_NOTIFY_PRIVATE_NETWORKS", NETWORKS, [],
        "Networks a webhook's or Slack URL's host may resolve to although they are not public (an "
        "installation whose receivers are internal: `10.0.0.0/8`). Empty: only URLs whose every address is "
        "public, so a subscription cannot make the server probe its own network.",
    )]
    NOTIFY_TIMEOUT_SECONDS: Annotated[float, Knob(
        "TRAINYARD_NOTIFY_TIMEOUT_SECONDS", NUMBER, 10.0,
        "How long one delivery waits for its receiver to connect and answer.",
    )]
    NOTIFY_RETRY_SECONDS: Annotated[float, Knob(
        "TRAINYARD_NOTIFY_RETRY_SECONDS", NUMBER, 30.0,
        "Wait before a failed delivery's second try; each later wait is 4 times the one before (at most an "
        "hour).",
    )]
    NOTIFY_RETRY_HOURS: Annotated[float, Knob(
        "TRAINYARD_NOTIFY_RETRY_HOURS", NUMBER, 24.0,
        "A delivery is retried until this long after its event, then shown failed.",
    )]
    NOTIFY_DISABLE_AFTER_DAYS: Annotated[float, Knob(
        "TRAINYARD_NOTIFY_DISABLE_AFTER_DAYS", NUMBER, 3.0,
        "A subscription none of whose deliveries got through for this long is disabled (with an audit "
        "entry for the workspace's admins).",
    )]
    NOTIFY_WAITING_MINUTES: Annotated[float, Knob(
        "TRAINYARD_NOTIFY_WAITING_MINUTES", NUMBER, 15.0,
        "A job pending this long for capacity (its offers had none, or all are blocked after failed "
        "launches) is told once as `job.waiting_capacity`; again only after it ran and waits anew.",
    )]
    NOTIFY_SWEEP_SECONDS: Annotated[float, Knob(
        "TRAINYARD_NOTIFY_SWEEP_SECONDS", NUMBER, 15.0,
        "How often Celery beat's `notify-sweep` sends the deliveries that are due (retries, and those a "
        "worker dropped).",
    )]


class TestHooks(TypedDict):
    """Each makes the server fail one thing on purpose, for the tests that
    check it recovers. Off unless set; with TRAINYARD_ENV=production, setting
    one stops the server from starting."""

    TEST_DROP_ACCEPTANCES: Annotated[str, Knob(
        "TRAINYARD_TEST_DROP_ACCEPTANCES", TEXT, "",
        "A file: each of its lines makes the server drop one job acceptance.",
    )]
    TEST_DROP_LOG_BATCHES: Annotated[str, Knob(
        "TRAINYARD_TEST_DROP_LOG_BATCHES", TEXT, "",
        "A file: each of its lines makes the server lose one log batch it acknowledged.",
    )]
    TEST_CRASH_SUBJECTS: Annotated[str, Knob(
        "TRAINYARD_TEST_CRASH_SUBJECTS", TEXT, "",
        "A file of task subjects (`job:<id>`): a task working on one kills its worker.",
    )]


# fmt: on


class TrainyardSettings(
    Access,
    RateLimitSettings,
    Storage,
    Jobs,
    Sessions,
    Logs,
    JobMetrics,
    Scheduling,
    Runners,
    Backends,
    LocalBackend,
    Notifications,
    TestHooks,
):
    """``settings.TRAINYARD``: the production topics from ``Access`` on, and the test hooks."""


# The topics in the order the docs list them, with their titles.
SERVER_TOPICS: tuple[tuple[str, Any], ...] = (
    ("Mode and paths", Mode),
    ("Web server and HTTPS", Web),
    ("Services", Services),
    ("Logs and metrics", Operations),
    ("Sign-in", SignIn),
    ("Accounts and limits", Access),
    ("Rate limits", RateLimitSettings),
    ("Storage", Storage),
    ("Files of a running job", Jobs),
    ("Sessions into jobs", Sessions),
    ("Job logs", Logs),
    ("Job metrics", JobMetrics),
    ("Scheduling", Scheduling),
    ("Runners", Runners),
    ("Cloud backends", Backends),
    ("Local backend", LocalBackend),
    ("Email", Email),
    ("Notifications", Notifications),
)
TEST_HOOKS_TOPIC: tuple[str, Any] = ("Test hooks", TestHooks)


def sources(topic: Any) -> Iterator[tuple[str, Any, Source]]:
    """``(key, type, source)`` of each key of ``topic``, in declaration order."""
    for key, hint in typing.get_type_hints(topic, include_extras=True).items():
        (source,) = hint.__metadata__
        yield key, hint.__origin__, source


def knobs_of(topic: Any) -> list[Knob]:
    return [knob for _, _, source in sources(topic) for knob in source.knobs()]


class Environment:
    """Reads topics from ``os.environ``, one after another; a computed default
    or a derived key sees every value read before it, by variable name."""

    def __init__(self) -> None:
        self.values: dict[str, Any] = {}

    def read(self, topic: Callable[..., T]) -> T:
        """A new plain dict of ``topic``'s keys, each read from its variable."""
        return topic(**{key: source.read(self.values) for key, _, source in sources(topic)})


def refuse_test_hooks(trainyard: Mapping[str, Any]) -> None:
    """Production runs no test hook: one that is set (on) is a ConfigError
    naming its variable."""
    for key, _, source in sources(TestHooks):
        if trainyard[key]:
            (knob,) = source.knobs()
            raise ConfigError(f"{knob.env} is a test hook, and TRAINYARD_ENV=production refuses test hooks: unset it.")


# --- Variables other programs read ------------------------------------------------


@dataclass(frozen=True)
class Elsewhere:
    """A variable another program reads (its own code has the default):
    listed here so the docs name every variable; ``read_by`` is the folder
    of the code that reads it."""

    env: str
    default: str
    meaning: str
    read_by: str


OTHER_PROGRAMS: tuple[tuple[str, str, tuple[Elsewhere, ...]], ...] = (
    (
        "make run and make test",
        "Read by the embedded supervisor (`python -m backend.embedded`), not by the server.",
        (
            Elsewhere("TRAINYARD_HOST", "127.0.0.1", "Address `make run`'s web server binds.", "backend/embedded"),
            Elsewhere("TRAINYARD_VALKEY_PORT", "6390", "Port of `make run`'s embedded Valkey.", "backend/embedded"),
            Elsewhere(
                "TRAINYARD_TEST_VALKEY_PORT",
                "6391",
                "Port of the embedded Valkey `make test` starts, apart from `make run`'s data.",
                "backend/embedded",
            ),
        ),
    ),
    (
        "The runner",
        "Read by each runner process from its own environment (runner/README.md lists its flags).",
        (
            Elsewhere(
                "TRAINYARD_RUNNER_RETRY_SECONDS",
                "600",
                "An upload or download retries network errors and 5xx this long (backoff with jitter).",
                "runner/trainyard_runner",
            ),
            Elsewhere(
                "TRAINYARD_RUNNER_KEEP_FAILED_SECONDS",
                "86400",
                "A job whose artifacts could not be uploaded keeps its files on the machine this long.",
                "runner/trainyard_runner",
            ),
            Elsewhere(
                "TRAINYARD_RUNNER_KEPT_RETRY_SECONDS",
                "30",
                "First pause between tries of uploading kept files again (doubling to 10 minutes).",
                "runner/trainyard_runner",
            ),
            Elsewhere(
                "TRAINYARD_ENVIRONMENTS_MAX_BYTES",
                "21474836480",
                "Built environments a machine keeps, at most this many bytes (least recently used go first).",
                "runner/trainyard_runner",
            ),
            Elsewhere(
                "TRAINYARD_ENVIRONMENTS_MAX_AGE_DAYS",
                "30",
                "A built environment unused this many days is deleted.",
                "runner/trainyard_runner",
            ),
            Elsewhere(
                "TRAINYARD_DATA_CACHE_MAX_BYTES",
                "",
                "Data inputs' files a machine keeps cached, at most this many bytes (least recently used go first;"
                " empty: half the work dir's disk).",
                "runner/trainyard_runner",
            ),
            Elsewhere(
                "TRAINYARD_DATA_CACHE_MAX_AGE_DAYS",
                "30",
                "A data input's cached file unused this many days is deleted.",
                "runner/trainyard_runner",
            ),
        ),
    ),
    (
        "The CLI",
        "Read by `trainyard` on your machine.",
        (
            Elsewhere("TRAINYARD_URL", "http://127.0.0.1:8000", "The server.", "cli/trainyard"),
            Elsewhere("TRAINYARD_TOKEN", "", "An API token; set, it wins over the saved one.", "cli/trainyard"),
            Elsewhere(
                "TRAINYARD_WORKSPACE",
                "",
                "The workspace; unset: the saved one, else your personal workspace.",
                "cli/trainyard",
            ),
            Elsewhere(
                "TRAINYARD_CODE_WARN_SIZE",
                "20MiB",
                "`trainyard run` lists the largest files and asks before uploading more code than this beyond "
                "the commit (bytes, or KB/MB/GB/KiB/MiB/GiB; `--code-warn-size` wins).",
                "cli/trainyard",
            ),
            Elsewhere(
                "TRAINYARD_STATUS_CHECK_SECONDS",
                "30",
                "While following a run, its status is read over REST after this long without a frame.",
                "cli/trainyard",
            ),
        ),
    ),
)


# --- The generated files ------------------------------------------------------------


def shown(value: Any) -> str:
    """A literal default as its variable would spell it (what reads back as
    that default: empty for an empty list or object)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, list) and all(isinstance(item, str) for item in value):
        return ",".join(value)
    if isinstance(value, list | dict):
        return json.dumps(value) if value else ""
    return str(value)


_UNITS = ((1 << 40, "TiB"), (1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB"))
_SPANS = ((86400, "days"), (3600, "hours"))


def _readable(knob: Knob) -> str:
    """`` (512 MiB)`` or `` (7 days)`` after a large literal default, for people."""
    value = knob.default
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        return ""
    units = _UNITS if knob.env.endswith("_BYTES") or "_MULTIPART_" in knob.env else ()
    spans = _SPANS if knob.env.endswith("_SECONDS") else ()
    for size, unit in (*units, *spans):
        if value >= size and value % size == 0:
            count = int(value // size)
            return f" ({count} {unit[:-1] if count == 1 and unit.endswith('s') else unit})"
    return ""


COLUMN = 37
WIDTH = 120


def _env_lines(assignment: str, note: str) -> list[str]:
    """``NAME=value   # note``, the note wrapped under itself (never inside a
    `code span`)."""
    kept = re.sub(r"`[^`]*`", lambda span: span[0].replace(" ", "\0"), note)
    lines = textwrap.wrap(
        kept,
        WIDTH,
        initial_indent=assignment.ljust(COLUMN - 1) + " # ",
        subsequent_indent=" " * COLUMN + "# ",
        break_on_hyphens=False,
        break_long_words=False,
    )
    return [line.replace("\0", " ") for line in lines]


def _knob_lines(knob: Knob, *, commented: bool = False) -> list[str]:
    if isinstance(knob.default, Computed):
        return _env_lines(f"#{knob.env}=", f"{knob.meaning} Default: {knob.default.shown}.")
    return _env_lines(f"{'#' if commented else ''}{knob.env}={shown(knob.default)}", knob.meaning)


def _heading(title: str, topic: Any = None) -> list[str]:
    """A section's rule, and its topic's description as comment lines."""
    lines = [f"# --- {title} ".ljust(80, "-")]
    if topic is not None:
        lines += textwrap.wrap(_doc(topic), 80, initial_indent="# ", subsequent_indent="# ")
    return lines


def env_example() -> str:
    """The text of ``.env.example``."""
    lines = [
        "# Every environment variable Trainyard reads, with its default. Generated from",
        "# backend/config/knobs.py (docs/CONFIGURATION.md is the same list with types):",
        f"# change the declaration and run `{REGENERATE}`.",
        "#",
        "# Defaults suit the embedded mode (`make run`); production sets TRAINYARD_ENV=production",
        '# and at least what docs/PRODUCTION.md\'s "Configuration for production" lists. A line starting',
        "# with # has a computed default, stated in its note: uncomment it to set a value.",
    ]
    for title, topic in SERVER_TOPICS:
        lines += ["", *_heading(title, topic)]
        for knob in knobs_of(topic):
            lines += _knob_lines(knob)
    title, topic = TEST_HOOKS_TOPIC
    lines += ["", *_heading(f"{title}: tests only", topic)]
    for knob in knobs_of(topic):
        lines += _knob_lines(knob, commented=True)
    for title, intro, entries in OTHER_PROGRAMS:
        lines += ["", *_heading(title), f"# {intro}"]
        for entry in entries:
            lines += _env_lines(f"{entry.env}={entry.default}", entry.meaning)
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _default_cell(knob: Knob) -> str:
    if isinstance(knob.default, Computed):
        return knob.default.shown
    text = shown(knob.default)
    return f"`{text}`{_readable(knob)}" if text else "empty"


def _table(rows: Sequence[Sequence[str]], header: Sequence[str]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(_cell(cell) for cell in row) + " |" for row in rows]
    return lines


def _doc(topic: Any) -> str:
    return " ".join((topic.__doc__ or "").split())


def markdown() -> str:
    """The text of docs/CONFIGURATION.md."""
    header = ("variable", "type", "default", "meaning")
    from_file = sorted({k.type.name.split(":")[0] for _, t in SERVER_TOPICS for k in knobs_of(t) if k.type.from_file})
    lines = [
        "# Configuration",
        "",
        "<!-- Generated from backend/config/knobs.py: change the declaration and run",
        f"     `{REGENERATE}` (it rewrites .env.example too). -->",
        "",
        "The server reads its configuration only from environment variables; this is every one,",
        "with its type, default and meaning. [`.env.example`](../.env.example) is the same list as",
        "a file to start from, and PRODUCTION.md's",
        '["Configuration for production"](PRODUCTION.md#configuration-for-production) what',
        "production must set. Defaults suit the embedded mode (`make run`); with",
        "`TRAINYARD_ENV=production` every unsafe default is an error at start, naming the",
        "variable to set.",
        "",
        f"A variable of type {' or '.join(from_file)} can instead be read from a file: set `<NAME>_FILE`",
        "to its path (for secrets: `DJANGO_SECRET_KEY_FILE=/run/secrets/django-key`).",
        "A number is seconds, bytes or a count as its name says; a boolean is `true`/`false`",
        "(or `1`/`0`, `yes`/`no`, `on`/`off`).",
    ]
    for title, topic in (*SERVER_TOPICS, TEST_HOOKS_TOPIC):
        rows = [(f"`{k.env}`", k.type.name, _default_cell(k), k.meaning) for k in knobs_of(topic)]
        lines += ["", f"## {title}", "", _doc(topic), "", *_table(rows, header)]
    lines += [
        "",
        "## Read by other programs",
        "",
        "Not the server's: each program reads its own. The runner's flags on a machine of your own are in",
        "[runner/README.md](../runner/README.md), the balancer's addresses in",
        "[DEPLOY.md](DEPLOY.md#the-balancers-configuration), and what a job's commands see in",
        "[RUNNER.md](RUNNER.md).",
    ]
    for title, intro, entries in OTHER_PROGRAMS:
        others = [(f"`{e.env}`", f"`{e.default}`" if e.default else "empty", e.meaning) for e in entries]
        lines += ["", f"### {title}", "", intro, "", *_table(others, ("variable", "default", "meaning"))]
    return "\n".join(lines) + "\n"


GENERATED = {".env.example": env_example, "docs/CONFIGURATION.md": markdown}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m backend.config.knobs", description="Print or write the files made from the declaration."
    )
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--env-example", action="store_true", help="print .env.example")
    which.add_argument("--markdown", action="store_true", help="print docs/CONFIGURATION.md")
    which.add_argument("--write", action="store_true", help="write both files into the checkout")
    args = parser.parse_args(argv)
    if args.write:
        for name, make in GENERATED.items():
            (CHECKOUT / name).write_text(make())
            print(f"wrote {name}")
    else:
        sys.stdout.write(env_example() if args.env_example else markdown())
    return 0


if __name__ == "__main__":
    sys.exit(main())
