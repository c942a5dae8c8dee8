"""Django settings, read only from the environment (see .env.example).

Safe defaults serve the embedded mode (`make run`); production sets
``TRAINYARD_ENV=production`` and every unsafe default then fails loudly.
"""

from __future__ import annotations

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

SECRET_KEY = env_str("DJANGO_SECRET_KEY", "")
if not SECRET_KEY:
    if PRODUCTION:
        raise ConfigError("DJANGO_SECRET_KEY must be set in production (or DJANGO_SECRET_KEY_FILE).")
    SECRET_KEY = "trainyard-embedded-development-key-not-for-production"
DEBUG = env_bool("DJANGO_DEBUG", not PRODUCTION)
ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", [] if PRODUCTION else ["*"])
if PRODUCTION and not ALLOWED_HOSTS:
    raise ConfigError("DJANGO_ALLOWED_HOSTS must list the server's host names in production.")
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS", [])

# The address runners and signed URLs use to reach this server.
PUBLIC_URL = env_str("TRAINYARD_PUBLIC_URL", f"http://127.0.0.1:{env_int('TRAINYARD_PORT', 8000)}").rstrip("/")

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
    "django.middleware.security.SecurityMiddleware",
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

# Persistent connections: the log path stores a batch every few milliseconds
# and a new connection per batch cost more than the COPY itself.
DATABASES = {
    "default": dj_database_url.parse(
        DATABASE_URL, conn_max_age=env_int("DATABASE_CONN_MAX_AGE", 60), conn_health_checks=True
    )
}

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
    "EXCEPTION_HANDLER": "backend.core.api_errors.api_exception_handler",
    "DEFAULT_PAGINATION_CLASS": "backend.core.pagination.PageNumberPagination",
    "PAGE_SIZE": 50,
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
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

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(levelname)s %(name)s: %(message)s"}},
    "filters": {"drop_beat_ticks": {"()": "backend.core.logfilters.DropBeatTicks"}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["console"], "level": env_str("TRAINYARD_LOG_LEVEL", "INFO")},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        # The reconciler runs every few seconds: one line per task and per
        # beat tick would bury everything else in `make run`'s output.
        "celery.app.trace": {"level": "WARNING"},
        "celery.worker.strategy": {"level": "WARNING"},
        "celery.beat": {"level": "INFO", "filters": ["drop_beat_ticks"]},
    },
}

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

SOCIAL_AUTH_PIPELINE = (
    "social_core.pipeline.social_auth.social_details",
    "social_core.pipeline.social_auth.social_uid",
    "social_core.pipeline.social_auth.auth_allowed",
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
    LEAK_SWEEP_SECONDS: float
    LEAK_MIN_AGE_SECONDS: float
    FACTS_REFRESH_SECONDS: float
    SECRET_KEYS: list[str]
    RUNNER_WHEELHOUSE: Path
    RUNNER_MAX_LIFETIME_SECONDS: float
    RUNNER_POWER_OFF_AFTER_SECONDS: float
    AWS_PRINCIPAL_ARN: str


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
    # Checkpoints (docs/RUNNER.md, "Checkpoints"): the runner syncs a job's
    # ``checkpoint:`` path this often when it changed; the server keeps this
    # many complete versions of a job and prunes older ones.
    "CHECKPOINT_SYNC_SECONDS": env_float("TRAINYARD_CHECKPOINT_SYNC_SECONDS", 300.0),
    "MOUNT_SYNC_SECONDS": env_float("TRAINYARD_MOUNT_SYNC_SECONDS", 10.0),
    "CHECKPOINT_KEEP": env_int("TRAINYARD_CHECKPOINT_KEEP", 3),
    # Runners
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
    "LEAK_SWEEP_SECONDS": env_float("TRAINYARD_LEAK_SWEEP_SECONDS", 60.0),
    # A machine with our tags and no live row is left alone until it is this old (CLOUDS.md: 10 min).
    "LEAK_MIN_AGE_SECONDS": env_float("TRAINYARD_LEAK_MIN_AGE_SECONDS", 600.0),
    # Account facts (zones, offerings, spot prices, quotas) are asked for again after this long.
    "FACTS_REFRESH_SECONDS": env_float("TRAINYARD_FACTS_REFRESH_SECONDS", 600.0),
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
}
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
}
