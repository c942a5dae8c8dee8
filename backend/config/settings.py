"""Django settings, read only from the environment (see .env.example).

Safe defaults serve the embedded mode (`make run`); production sets
``TRAINYARD_ENV=production`` and every unsafe default then fails loudly.
"""

from __future__ import annotations

import re
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any, TypedDict

import dj_database_url

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
    read_env_file,
)

BASE_DIR = Path(__file__).resolve().parent.parent.parent
TRAINYARD_ENV = env_str("TRAINYARD_ENV", "development")
PRODUCTION = TRAINYARD_ENV == "production"
DATA_DIR = Path(env_str("TRAINYARD_DATA_DIR", str(BASE_DIR / ".trainyard-data"))).resolve()

# The embedded supervisor writes the URLs of the servers it started here, so
# `.venv/bin/python manage.py …` finds them while `make run` is up.
_embedded = read_env_file(DATA_DIR / "embedded.env")
DATABASE_URL = env_str("DATABASE_URL") or _embedded.get("DATABASE_URL", "")
REDIS_URL = env_str("REDIS_URL") or _embedded.get("REDIS_URL", "")
if not DATABASE_URL or not REDIS_URL:
    raise ConfigError(
        "DATABASE_URL and REDIS_URL are not set and no embedded servers are running "
        f"(no {DATA_DIR / 'embedded.env'}). Start them with `make run`, or set both variables."
    )

DEVELOPMENT_SECRET_KEY = "trainyard-embedded-development-key-not-for-production"
SECRET_KEY = env_str("DJANGO_SECRET_KEY", "")
if not SECRET_KEY:
    if PRODUCTION:
        raise ConfigError("DJANGO_SECRET_KEY must be set in production (or DJANGO_SECRET_KEY_FILE).")
    SECRET_KEY = DEVELOPMENT_SECRET_KEY
DEBUG = env_bool("DJANGO_DEBUG", not PRODUCTION)
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", [] if PRODUCTION else ["*"])
if PRODUCTION and not ALLOWED_HOSTS:
    raise ConfigError("DJANGO_ALLOWED_HOSTS must list the server's host names in production.")
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

# The address runners and signed URLs use to reach this server.
PUBLIC_URL = env_str("TRAINYARD_PUBLIC_URL", f"http://127.0.0.1:{env_int('TRAINYARD_PORT', 8000)}").rstrip("/")

# --- HTTPS and browser hardening (docs/decisions/0041-https-and-csp.md) -----
# On in production: the site is served over HTTPS, directly or by a proxy that
# terminates TLS; cookies are secure-only, plain HTTP is redirected, HSTS is sent.
HTTPS = env_bool("TRAINYARD_HTTPS", PRODUCTION)
if HTTPS and not PUBLIC_URL.startswith("https://"):
    raise ConfigError(
        f"TRAINYARD_PUBLIC_URL is {PUBLIC_URL}, but the site is served over HTTPS (TRAINYARD_HTTPS, on in "
        "production): set TRAINYARD_PUBLIC_URL=https://<host>, or TRAINYARD_HTTPS=false to serve plain HTTP."
    )
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
SECURE_SSL_REDIRECT = HTTPS
# Load balancers probe the health endpoint over plain HTTP.
SECURE_REDIRECT_EXEMPT = [r"^api/v1/health/$"]  # /healthz, /readyz, /metrics: backend/ops/middleware.py
SECURE_HSTS_SECONDS = env_int("TRAINYARD_HSTS_SECONDS", 31_536_000 if HTTPS else 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = SECURE_HSTS_SECONDS > 0
SECURE_HSTS_PRELOAD = env_bool("TRAINYARD_HSTS_PRELOAD", False)
if not SECURE_HSTS_PRELOAD:
    # Preloading is the operator's commitment for a whole domain, never a default.
    SILENCED_SYSTEM_CHECKS = ["security.W021"]
# The header a TLS-terminating proxy sets (and overwrites) to say the request
# came over HTTPS; empty: no proxy, trust only the connection itself.
_proxy_ssl_header = env_str("TRAINYARD_PROXY_SSL_HEADER", "X-Forwarded-Proto" if HTTPS else "")
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_" + _proxy_ssl_header.upper().replace("-", "_"), "https") if _proxy_ssl_header else None
)

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "channels",
    "rest_framework",
    "django_filters",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "social_django",
    "backend.core",
    "backend.accounts.apps.AccountsConfig",
    "backend.repos",
    "backend.clouds",
    "backend.runs.apps.RunsConfig",
    "backend.artifacts",
    "backend.vault",
]

MIDDLEWARE = [
    # /healthz, /readyz and /metrics, answered before host checks, HTTPS
    # redirects, sessions and auth: what a probe or a scraper needs.
    "backend.ops.middleware.OperationsEndpoints",
    "django.middleware.security.SecurityMiddleware",
    "backend.core.csp.ContentSecurityPolicyMiddleware",
    # 400 for a NUL or control character in the path or query (backend/core/input.py).
    "backend.core.input.RefuseControlCharacters",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Turns every GitHub sign-in failure into a redirect to /?auth_error=…
    "backend.accounts.middleware.SignInErrorMiddleware",
]

ROOT_URLCONF = "backend.config.urls"
ASGI_APPLICATION = "backend.config.asgi.application"
AUTH_USER_MODEL = "accounts.User"
# Both are always listed; each checks at request time whether it is enabled
# (GITHUB_CLIENT_ID / TRAINYARD_LOCAL_LOGIN below), so a disabled one neither
# signs anybody in nor keeps an existing session alive.
AUTHENTICATION_BACKENDS = [
    "backend.accounts.auth.LocalLoginBackend",
    "backend.accounts.github.GithubOAuth2PKCE",
]
LOGIN_URL = "/"
LOGIN_REDIRECT_URL = "/"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "backend" / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# Database connections (docs/decisions/0059-connection-pool.md).
# The web process pools them: under ASGI each request's sync code runs in a
# new thread and Django's connections are per thread, so without a pool every
# request opened one (~7 ms). uvicorn imports asgi.py, which loads these
# settings: that is how a web process is told apart. Every other process
# (Celery worker and beat, manage.py, pytest) keeps one persistent connection
# per thread instead: a prefork child runs one task at a time, and Celery
# closes a pool around every task. A pooled connection is checked before it
# is handed out (conn_health_checks), so one that died with Postgres is
# replaced, not used.
DB_POOL = env_bool("TRAINYARD_DB_POOL", "backend.config.asgi" in sys.modules)
DATABASES = {
    "default": dj_database_url.parse(
        DATABASE_URL,
        # The pool needs 0. Without it, persistent connections: the log path
        # stores a batch every few milliseconds and a new connection per batch
        # cost more than the COPY itself.
        conn_max_age=0 if DB_POOL else env_int("DATABASE_CONN_MAX_AGE", 60),
        conn_health_checks=True,
    )
}
if DB_POOL:
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": env_int("TRAINYARD_DB_POOL_MIN", 2),
        "max_size": env_int("TRAINYARD_DB_POOL_MAX", 20),
        # A request waits this long for a free connection, then fails.
        "timeout": env_float("TRAINYARD_DB_POOL_TIMEOUT", 5.0),
        # While Postgres is down, a reconnect is retried with backoff for this
        # long, then started again from 1 s: it is back within seconds.
        "reconnect_timeout": 5.0,
    }

# A group membership not renewed for this long is dropped by the channel layer;
# followers renew theirs (backend/runs/consumers/watch.py).
CHANNEL_GROUP_EXPIRY_SECONDS = env_int("TRAINYARD_CHANNEL_GROUP_EXPIRY_SECONDS", 86400)
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            # redis-py 8 reads with a 5 s socket timeout by default, the same
            # as channels_redis's blocking BZPOPMIN: an idle consumer then
            # dies with TimeoutError and drops its websocket. Read longer.
            "hosts": [{"address": REDIS_URL, "socket_timeout": 30, "socket_connect_timeout": 5}],
            "prefix": env_str("TRAINYARD_CHANNEL_PREFIX", "trainyard"),
            # A follower of a 200k-line job receives one message per stored
            # batch; room for bursts without dropping.
            "capacity": 1000,
            "expiry": 60,
            "group_expiry": CHANNEL_GROUP_EXPIRY_SECONDS,
        },
    }
}

CELERY_BROKER_URL = REDIS_URL
CELERY_RESULT_BACKEND = None
CELERY_TASK_ACKS_LATE = True
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TASK_TIME_LIMIT = 300
CELERY_TASK_SOFT_TIME_LIMIT = 240
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
# Reconnect to the broker forever: with Celery's default (100 tries, up to
# 30 s apart) a worker exits after a Redis outage of about 45 minutes.
CELERY_BROKER_CONNECTION_MAX_RETRIES = None
CELERY_TASK_IGNORE_RESULT = True
CELERY_WORKER_HIJACK_ROOT_LOGGER = False  # Django's LOGGING applies in workers too
CELERY_BROKER_TRANSPORT_OPTIONS = {
    "visibility_timeout": 600,
    # Without a socket timeout, a publish to a broker that stops answering
    # without closing the connection (frozen, failed over) waits forever; the
    # web process publishes from its database thread, so every runner
    # connection of that process would stall with it. Only synchronous
    # commands wait on this: the worker's BRPOP runs with the event loop.
    "socket_timeout": 10,
    "socket_connect_timeout": 5,
}

STATIC_URL = "/static/"
STATIC_ROOT = DATA_DIR / "static"
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}
WHITENOISE_USE_FINDERS = True
# The web dashboard's build: dist/app-assets/* at /app-assets/* (backend/core/spa.py).
WHITENOISE_ROOT = BASE_DIR / "frontend" / "dist"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "backend.accounts.auth.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # DRF's defaults, with a JSON parser that refuses NUL characters (backend/core/input.py).
    "DEFAULT_PARSER_CLASSES": [
        "backend.core.input.JSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "EXCEPTION_HANDLER": "backend.core.api_errors.api_exception_handler",
    "DEFAULT_PAGINATION_CLASS": "backend.core.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    # Only views that name a scope per method (``throttle_scopes``) are counted (backend/core/throttling.py).
    "DEFAULT_THROTTLE_CLASSES": ["backend.core.throttling.ScopedRedisThrottle"],
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Trainyard API",
    "DESCRIPTION": "Run ML training workflows in your own cloud.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "COMPONENT_SPLIT_REQUEST": True,
    # Swagger UI from our own static files: no CDN, works offline.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "REDOC_DIST": "SIDECAR",
    "ENUM_NAME_OVERRIDES": {
        "Role": "backend.accounts.models.Role",
        "InstanceStatus": "backend.clouds.models.InstanceStatus",
        "CredentialKind": "backend.vault.models.CredentialKind",
        "BackendEnum": "backend.clouds.models.BackendKind",
        "KindEnum": [("git", "git"), ("archive", "archive")],
        "ConnectableKindEnum": [("aws", "aws")],
    },
}

# "plain" (the default) or "json": one JSON object per line, for a log
# collector (docs/DEPLOY.md, "Logs"). In JSON, the web server's own loggers go
# through the same handler, so its access and error lines are JSON too.
LOG_FORMAT = env_str("TRAINYARD_LOG_FORMAT", "plain").strip().lower() or "plain"
if LOG_FORMAT not in ("plain", "json"):
    raise ConfigError(f"TRAINYARD_LOG_FORMAT={LOG_FORMAT!r} is not a log format: use plain or json.")
_SERVER_LOGGERS = ("uvicorn", "uvicorn.error", "uvicorn.access", "daphne")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(levelname)s %(name)s: %(message)s"},
        "json": {"()": "backend.core.logjson.JsonFormatter"},
    },
    "filters": {"drop_beat_ticks": {"()": "backend.core.logfilters.DropBeatTicks"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": env_str("TRAINYARD_LOG_LEVEL", "INFO")},
    "loggers": {
        **(
            {
                **{name: {"handlers": ["console"], "propagate": False} for name in _SERVER_LOGGERS},
                # Django's own default handler (plain text, in DEBUG) is dropped: its records reach the root.
                "django": {"handlers": [], "propagate": True},
            }
            if LOG_FORMAT == "json"
            else {}
        ),
        "django.db.backends": {"level": "WARNING"},
        # The reconciler runs every few seconds: one line per task and per
        # beat tick would bury everything else in `make run`'s output.
        "celery.app.trace": {"level": "WARNING"},
        "celery.worker.strategy": {"level": "WARNING"},
        "celery.beat": {"level": "INFO", "filters": ["drop_beat_ticks"]},
    },
}

# --- Operations (docs/DEPLOY.md) -------------------------------------------
# /metrics answers only with this bearer token; unset, it answers 404.
METRICS_TOKEN = env_str("TRAINYARD_METRICS_TOKEN", "")
# Shared metric values in Redis live under this prefix (the channel layer's:
# installs sharing a Redis stay apart).
METRICS_PREFIX = env_str("TRAINYARD_CHANNEL_PREFIX", "trainyard") + ":metrics"

# --- Sign-in ----------------------------------------------------------------
# A GitHub OAuth app (or GitHub Enterprise: set both URLs). The app's callback
# URL is <TRAINYARD_PUBLIC_URL>/auth/complete/github/.
GITHUB_CLIENT_ID = env_str("GITHUB_CLIENT_ID", "")
GITHUB_CLIENT_SECRET = env_str("GITHUB_CLIENT_SECRET", "")
if bool(GITHUB_CLIENT_ID) != bool(GITHUB_CLIENT_SECRET):
    raise ConfigError("Set both GITHUB_CLIENT_ID and GITHUB_CLIENT_SECRET (or GITHUB_CLIENT_SECRET_FILE), or neither.")
GITHUB_URL = env_url("GITHUB_URL", "https://github.com")
GITHUB_API_URL = env_url("GITHUB_API_URL", "https://api.github.com")
# The local password login (user `admin`, see ensure_admin): the embedded
# default's way in when no GitHub app is configured.
TRAINYARD_LOCAL_LOGIN = env_bool("TRAINYARD_LOCAL_LOGIN", not GITHUB_CLIENT_ID)
# Who may sign in with GitHub: logins and `org:<name>` (active members of that
# organization; asks GitHub for read:org). Empty: every GitHub user. Checked
# at each sign-in (backend/accounts/pipeline.py); required at start while the
# local backend is on (see the end of this file).
TRAINYARD_GITHUB_ALLOW = [entry.lower() for entry in env_list("TRAINYARD_GITHUB_ALLOW", [])]
_GITHUB_NAME = re.compile(r"^(org:)?[a-z0-9](?:[a-z0-9]|-(?=[a-z0-9])){0,38}$")
if bad := [entry for entry in TRAINYARD_GITHUB_ALLOW if not _GITHUB_NAME.match(entry)]:
    raise ConfigError(f"TRAINYARD_GITHUB_ALLOW: {bad[0]!r} is not a GitHub login or org:<organization>.")

SOCIAL_AUTH_PIPELINE = (
    "social_core.pipeline.social_auth.social_details",
    "social_core.pipeline.social_auth.social_uid",
    "social_core.pipeline.social_auth.auth_allowed",
    # TRAINYARD_GITHUB_ALLOW: refused before any account is made or updated.
    "backend.accounts.pipeline.github_allowed",
    # Finds or creates the user by GitHub's numeric id: never by email.
    "backend.accounts.pipeline.github_user",
    "social_core.pipeline.social_auth.social_user",
    "social_core.pipeline.social_auth.associate_user",
)
SOCIAL_AUTH_LOGIN_REDIRECT_URL = "/"
SOCIAL_AUTH_NEW_USER_REDIRECT_URL = "/"
SOCIAL_AUTH_LOGIN_ERROR_URL = "/"
SOCIAL_AUTH_INACTIVE_USER_URL = "/?auth_error=This+account+is+disabled."
SOCIAL_AUTH_REQUESTS_TIMEOUT = 10
SOCIAL_AUTH_REDIRECT_IS_HTTPS = PUBLIC_URL.startswith("https://")

# --- Trainyard ------------------------------------------------------------


class TrainyardSettings(TypedDict):
    """The type of ``settings.TRAINYARD``: mypy reads each key's type from here."""

    STORAGE: str
    STORAGE_DIR: Path
    SIGNED_URL_SECONDS: int
    MAX_BLOB_BYTES: int
    S3_URL_SECONDS: int
    MULTIPART_THRESHOLD: int
    MULTIPART_PART_SIZE: int
    STORAGE_QUOTA_BYTES: int
    GC_GRACE_SECONDS: float
    GC_EVERY_SECONDS: float
    UNAUTHENTICATED_BODY_BYTES: int
    CHECKPOINT_SYNC_SECONDS: float
    MOUNT_SYNC_SECONDS: float
    CHECKPOINT_KEEP: int
    HEARTBEAT_SECONDS: float
    HEARTBEAT_TIMEOUT_SECONDS: float
    LEASE_SECONDS: float
    STOP_GRACE_SECONDS: float
    LOCAL_RUNNERS_MAX: int
    LOCAL_RUNNER_IDLE_SECONDS: float
    LOCAL_RUNNER_COMMAND: str
    LOCAL_BACKEND_ENABLED: bool
    RECONCILE_SECONDS: float
    PROVISION_TIMEOUT_SECONDS: float
    UNREACHABLE_GRACE_SECONDS: float | None
    INSTALLATION: str
    LOCAL_SHAPES: list[dict[str, Any]]
    BACKEND_KINDS: dict[str, str]
    TEST_DROP_ACCEPTANCES: str
    TEST_DROP_LOG_BATCHES: str
    LOG_PAGE_BYTES: int
    RUNS_EXACT_COUNT_UP_TO: int
    LOG_CAP_BYTES: int
    LOG_RETENTION_DAYS: int
    LOG_ARCHIVE_AFTER_SECONDS: float
    TEST_CRASH_SUBJECTS: str
    DB_CONFLICT_RETRIES: int
    TASK_MAX_DELIVERIES: int
    SCHEDULE_MAX_PASSES: int
    ASSIGN_ON_SUBMIT: bool
    ASSIGN_ON_IDLE: bool
    LEAK_SWEEP_SECONDS: float
    LEAK_MIN_AGE_SECONDS: float
    FACTS_REFRESH_SECONDS: float
    WARM_BACKENDS: bool
    SECRET_KEYS: list[str]
    RUNNER_WHEELHOUSE: Path
    RUNNER_MAX_LIFETIME_SECONDS: float
    RUNNER_POWER_OFF_AFTER_SECONDS: float
    INPUT_PAGE_FILES: int
    AWS_PRINCIPAL_ARN: str
    RATE_LIMITS: dict[str, dict[str, tuple[int, int] | None]]
    INVITATION_DAYS: float
    RATE_LIMIT_PREFIX: str
    WS_RECHECK_SECONDS: float


# Rate limits (backend/core/ratelimit.py): per scope, hits per user and per
# client address in a fixed window, counted in Redis. Defaults are generous
# (the test suite and `make run` never reach them); `off` switches one off.
_RATE_DEFAULTS = {
    "login": ("20/min", "60/min"),  # password login (user: the username tried) and the GitHub sign-in start
    "token": ("20/min", "60/min"),  # API token creation
    "run": ("120/min", "600/min"),  # run submission and re-run
    "blob": ("120/min", "600/min"),  # code archive / patch upload
    "plan": ("120/min", "600/min"),  # the dry-run plan
    "ws": ("240/min", "1200/min"),  # browser and CLI websocket connects
    # Runner websocket connects: "user" is per runner (its token), "ip" counts
    # only connects whose token was refused, so a fleet behind one NAT is never limited.
    "runner": ("60/min", "120/min"),
}
_RATE_LIMITS = {
    scope: {
        "user": env_rate(f"TRAINYARD_RATE_{scope.upper()}_USER", user),
        "ip": env_rate(f"TRAINYARD_RATE_{scope.upper()}_IP", ip),
    }
    for scope, (user, ip) in _RATE_DEFAULTS.items()
}


TRAINYARD: TrainyardSettings = {
    # Storage for artifacts and code blobs: "local" (files under DATA_DIR) for
    # the embedded default. A workspace with an AWS connection whose config
    # names a bucket stores new objects there instead (docs/STORAGE.md).
    "STORAGE": env_str("TRAINYARD_STORAGE", "local"),
    "STORAGE_DIR": Path(env_str("TRAINYARD_STORAGE_DIR", str(DATA_DIR / "storage"))),
    "SIGNED_URL_SECONDS": env_int("TRAINYARD_SIGNED_URL_SECONDS", 900),
    "MAX_BLOB_BYTES": env_int("TRAINYARD_MAX_BLOB_BYTES", 512 * 1024 * 1024),
    # S3: presigned URLs live at most this long (capped at 900 s, and below what
    # is left of a role's credentials); files above the threshold are uploaded
    # in parts of this size (S3: 5 MiB minimum, 10,000 parts at most).
    "S3_URL_SECONDS": env_int("TRAINYARD_S3_URL_SECONDS", 900),
    "MULTIPART_THRESHOLD": env_int("TRAINYARD_MULTIPART_THRESHOLD", 64 * 1024 * 1024),
    "MULTIPART_PART_SIZE": env_int("TRAINYARD_MULTIPART_PART_SIZE", 64 * 1024 * 1024),
    # Bytes a workspace may keep in storage (artifacts, checkpoint versions,
    # caches, code blobs; 0: no quota); a workspace's storage_quota_bytes
    # overrides it. An upload that would go over is refused with 413.
    "STORAGE_QUOTA_BYTES": env_int("TRAINYARD_STORAGE_QUOTA_BYTES", 1 << 40),
    # Storage garbage collection (backend/artifacts/gc.py), this often: an
    # unreferenced blob, an abandoned upload or a stale temporary file goes
    # only once it is older than the grace period.
    "GC_GRACE_SECONDS": env_float("TRAINYARD_GC_GRACE_SECONDS", 7 * 86400.0),
    "GC_EVERY_SECONDS": env_float("TRAINYARD_GC_EVERY_SECONDS", 3600.0),
    # A request without a valid credential whose body is larger than this is
    # refused (413) before its body is read (backend/config/body_limit.py).
    "UNAUTHENTICATED_BODY_BYTES": env_int("TRAINYARD_UNAUTHENTICATED_BODY_BYTES", 64 * 1024),
    # Checkpoints (docs/RUNNER.md, "Checkpoints"): the runner syncs a job's
    # ``checkpoint:`` path this often when it changed; the server keeps this
    # many complete versions of a job and prunes older ones.
    "CHECKPOINT_SYNC_SECONDS": env_float("TRAINYARD_CHECKPOINT_SYNC_SECONDS", 300.0),
    "MOUNT_SYNC_SECONDS": env_float("TRAINYARD_MOUNT_SYNC_SECONDS", 10.0),
    "CHECKPOINT_KEEP": env_int("TRAINYARD_CHECKPOINT_KEEP", 3),
    # Runners
    # Files per page of an input's manifest (GET …/runner/jobs/<job>/inputs/).
    "INPUT_PAGE_FILES": env_int("TRAINYARD_INPUT_PAGE_FILES", 1000),
    "HEARTBEAT_SECONDS": env_float("TRAINYARD_HEARTBEAT_SECONDS", 2.0),
    "HEARTBEAT_TIMEOUT_SECONDS": env_float("TRAINYARD_HEARTBEAT_TIMEOUT_SECONDS", 15.0),
    "LEASE_SECONDS": env_float("TRAINYARD_LEASE_SECONDS", 15.0),
    # Longer than the runner's ack timeout plus its drain timeout (30 + 60 s),
    # so a runner still draining a large log backlog is not declared silent.
    "STOP_GRACE_SECONDS": env_float("TRAINYARD_STOP_GRACE_SECONDS", 100.0),
    # Local backend: runner processes on this host.
    "LOCAL_RUNNERS_MAX": env_int("TRAINYARD_LOCAL_RUNNERS_MAX", 4),
    "LOCAL_RUNNER_IDLE_SECONDS": env_float("TRAINYARD_LOCAL_RUNNER_IDLE_SECONDS", 300.0),
    "LOCAL_RUNNER_COMMAND": env_str("TRAINYARD_LOCAL_RUNNER_COMMAND", ""),
    "LOCAL_BACKEND_ENABLED": env_bool("TRAINYARD_LOCAL_BACKEND", not PRODUCTION),
    "RECONCILE_SECONDS": env_float("TRAINYARD_RECONCILE_SECONDS", 2.0),
    "PROVISION_TIMEOUT_SECONDS": env_float("TRAINYARD_PROVISION_TIMEOUT_SECONDS", 60.0),
    # A silent runner whose machine is still there keeps its job this long.
    # Unset: each backend's own (Timings.unreachable_grace; 120 s for local and fake).
    "UNREACHABLE_GRACE_SECONDS": env_float("TRAINYARD_UNREACHABLE_GRACE_SECONDS", 0.0) or None,
    # Tags every machine this server starts (the leak sweep finds ours by it).
    "INSTALLATION": env_str("TRAINYARD_INSTALLATION", ""),
    # Machine shapes the local backend offers (JSON list; tests): each runner reports its shape.
    "LOCAL_SHAPES": env_json("TRAINYARD_LOCAL_SHAPES", []),
    # More backend kinds: {"kind": "package.module:Class"} (JSON).
    "BACKEND_KINDS": env_json("TRAINYARD_BACKEND_KINDS", {}),
    # Test hook: a file whose lines each drop one job acceptance (never set in production).
    "TEST_DROP_ACCEPTANCES": env_str("TRAINYARD_TEST_DROP_ACCEPTANCES", ""),
    # Test hook: a file whose lines each make the server lose one stored log batch.
    "TEST_DROP_LOG_BATCHES": env_str("TRAINYARD_TEST_DROP_LOG_BATCHES", ""),
    # Logs (docs/RUNS.md, "Logs"): one page of a job's log (REST, a follower's
    # catch-up) holds at most this many bytes of text (and at least one line);
    # a job stores at most LOG_CAP_BYTES of output unless its workspace sets
    # its own cap; finished runs' logs are deleted after LOG_RETENTION_DAYS (0: kept).
    "LOG_PAGE_BYTES": env_int("TRAINYARD_LOG_PAGE_BYTES", 4 << 20),
    # The runs list counts its matches exactly up to this many; above, it
    # gives the planner's estimate and says so (count_estimated: docs/API.md).
    "RUNS_EXACT_COUNT_UP_TO": env_int("TRAINYARD_RUNS_EXACT_COUNT_UP_TO", 1000),
    "LOG_CAP_BYTES": env_int("TRAINYARD_LOG_CAP_BYTES", 1 << 30),
    "LOG_RETENTION_DAYS": env_int("TRAINYARD_LOG_RETENTION_DAYS", 90),
    # A finished job's log is compacted into one object in its workspace's
    # storage this long after it ended (docs/LOGS.md, "Archive"); 0: never.
    "LOG_ARCHIVE_AFTER_SECONDS": env_float("TRAINYARD_LOG_ARCHIVE_AFTER_SECONDS", 120.0),
    # Test hook: a file of task subjects ("job:<id>"); a task that notes one kills its worker (never in production).
    "TEST_CRASH_SUBJECTS": env_str("TRAINYARD_TEST_CRASH_SUBJECTS", ""),
    # A transaction that lost a deadlock or serialization race is tried again this many times (backend/core/db.py).
    "DB_CONFLICT_RETRIES": env_int("TRAINYARD_DB_CONFLICT_RETRIES", 5),
    # A task whose worker died this many times under it is parked, not run again (backend/core/deliveries.py).
    "TASK_MAX_DELIVERIES": env_int("TRAINYARD_TASK_MAX_DELIVERIES", 3),
    # One schedule task runs at most this many passes in a row while new requests keep coming.
    "SCHEDULE_MAX_PASSES": env_int("TRAINYARD_SCHEDULE_MAX_PASSES", 20),
    # A submission an idle runner fits is assigned in the request's own transaction (docs/RUNS.md, "Warm start").
    "ASSIGN_ON_SUBMIT": env_bool("TRAINYARD_ASSIGN_ON_SUBMIT", True),
    # A runner that finished a job takes the next pending one it fits at once, without a pass (docs/RUNS.md).
    "ASSIGN_ON_IDLE": env_bool("TRAINYARD_ASSIGN_ON_IDLE", True),
    "LEAK_SWEEP_SECONDS": env_float("TRAINYARD_LEAK_SWEEP_SECONDS", 60.0),
    # A machine with our tags and no live row is left alone until it is this old (CLOUDS.md: 10 min).
    "LEAK_MIN_AGE_SECONDS": env_float("TRAINYARD_LEAK_MIN_AGE_SECONDS", 600.0),
    # Account facts (zones, offerings, spot prices, quotas) are asked for again after this long.
    "FACTS_REFRESH_SECONDS": env_float("TRAINYARD_FACTS_REFRESH_SECONDS", 600.0),
    # The Celery worker loads every backend's SDK data (botocore's models:
    # ~0.3 s, ~25 MB) before it forks its pool, so no pool process pays it on its first launch.
    "WARM_BACKENDS": env_bool("TRAINYARD_WARM_BACKENDS", True),
    # Fernet keys for secrets at rest; the first encrypts (see backend/vault/crypto.py).
    "SECRET_KEYS": env_list("TRAINYARD_SECRET_KEYS", []),
    # Machines that boot from an image install the runner from this server
    # (/runner/wheels/): the wheels are made here once (docs/RUNNER.md, "Bootstrap").
    "RUNNER_WHEELHOUSE": Path(env_str("TRAINYARD_RUNNER_WHEELHOUSE", str(DATA_DIR / "runner-wheels"))),
    # Such a machine powers itself off after this long, whatever it runs (0: never) …
    "RUNNER_MAX_LIFETIME_SECONDS": env_float("TRAINYARD_RUNNER_MAX_LIFETIME_SECONDS", 7 * 86400.0),
    # … and after this long without the server while idle (0: never).
    "RUNNER_POWER_OFF_AFTER_SECONDS": env_float("TRAINYARD_RUNNER_POWER_OFF_AFTER_SECONDS", 1800.0),
    # The server's own AWS identity (role or user ARN): the principal a
    # workspace's role trusts (GET .../backends/aws/setup; README "Connecting AWS").
    "AWS_PRINCIPAL_ARN": env_str("TRAINYARD_AWS_PRINCIPAL_ARN", ""),
    "RATE_LIMITS": _RATE_LIMITS,
    # An invitation to a workspace not taken up within this many days is void (inviting again renews it).
    "INVITATION_DAYS": env_float("TRAINYARD_INVITATION_DAYS", 7.0),
    # The counters' key prefix in Redis (the channel layer's, so installs sharing a Redis stay apart).
    "RATE_LIMIT_PREFIX": env_str("TRAINYARD_CHANNEL_PREFIX", "trainyard") + ":ratelimit",
    # A browser or CLI websocket re-checks its credentials and membership this
    # often, and is closed once they are gone (signed out, token revoked, removed, deactivated).
    "WS_RECHECK_SECONDS": env_float("TRAINYARD_WS_RECHECK_SECONDS", 30.0),
}
# GitHub sign-in opens the server to people it does not know: with the local
# backend on, anyone signing in would run commands on this host, and with the
# built-in key anyone could forge a session (or a runner's token).
if GITHUB_CLIENT_ID and SECRET_KEY == DEVELOPMENT_SECRET_KEY:
    raise ConfigError(
        "GitHub sign-in is configured (GITHUB_CLIENT_ID) with the built-in development DJANGO_SECRET_KEY,"
        " which anyone can read: set DJANGO_SECRET_KEY (or DJANGO_SECRET_KEY_FILE) to a long random value."
    )
if GITHUB_CLIENT_ID and TRAINYARD["LOCAL_BACKEND_ENABLED"] and not TRAINYARD_GITHUB_ALLOW:
    raise ConfigError(
        "GitHub sign-in is configured (GITHUB_CLIENT_ID) and the local backend is on, so any GitHub user"
        " could sign in and run commands on this host as the server's user. Set TRAINYARD_GITHUB_ALLOW to who"
        " may sign in (GitHub logins and org:<organization>, comma-separated, e.g. alice,org:acme), or turn"
        " the local backend off (TRAINYARD_LOCAL_BACKEND=false)."
    )
if PRODUCTION and not TRAINYARD["SECRET_KEYS"]:
    raise ConfigError(
        "TRAINYARD_SECRET_KEYS must be set in production: generate one with "
        "python -c 'from cryptography.fernet import Fernet; print(Fernet.generate_key().decode())'"
    )

CELERY_BEAT_SCHEDULE = {
    "reconcile": {
        "task": "backend.runs.tasks.reconcile",
        "schedule": timedelta(seconds=TRAINYARD["RECONCILE_SECONDS"]),
    },
    # Checks every minute; an account's facts are refreshed when older than FACTS_REFRESH_SECONDS.
    "facts-refresh": {"task": "backend.clouds.tasks.facts_refresh", "schedule": timedelta(seconds=60)},
    "logs-prune": {"task": "backend.runs.tasks.logs_prune", "schedule": timedelta(hours=1)},
    "logs-archive": {"task": "backend.runs.tasks.logs_archive", "schedule": timedelta(seconds=30)},
    "storage-gc": {
        "task": "backend.artifacts.tasks.storage_gc",
        "schedule": timedelta(seconds=TRAINYARD["GC_EVERY_SECONDS"]),
    },
}
