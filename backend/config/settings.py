"""Django settings, read only from the environment: every variable is
declared once, with its default and meaning, in backend/config/knobs.py
(listed in docs/CONFIGURATION.md and .env.example).

Safe defaults serve the embedded mode (`make run`); production sets
``TRAINYARD_ENV=production`` and every unsafe default then fails loudly.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import dj_database_url

from backend.access.webapps.origin import apps_origin_check, apps_origin_parse
from backend.config import knobs
from backend.core.env import ConfigError, read_env_file

BASE_DIR = Path(__file__).resolve().parent.parent.parent
_env = knobs.Environment()
_mode = _env.read(knobs.Mode)
TRAINYARD_ENV = _mode["TRAINYARD_ENV"]
PRODUCTION = TRAINYARD_ENV == "production"
DATA_DIR = _mode["DATA_DIR"]

# The embedded supervisor writes the URLs of the servers it started here, so
# `.venv/bin/python manage.py …` finds them while `make run` is up.
_services = _env.read(knobs.Services)
_embedded = read_env_file(DATA_DIR / "embedded.env")
DATABASE_URL = _services["DATABASE_URL"] or _embedded.get("DATABASE_URL", "")
REDIS_URL = _services["REDIS_URL"] or _embedded.get("REDIS_URL", "")
if not DATABASE_URL or not REDIS_URL:
    raise ConfigError(
        "DATABASE_URL and REDIS_URL are not set and no embedded servers are running "
        f"(no {DATA_DIR / 'embedded.env'}). Start them with `make run`, or set both variables."
    )

_web = _env.read(knobs.Web)
DEVELOPMENT_SECRET_KEY = "trainyard-embedded-development-key-not-for-production"
SECRET_KEY = _web["SECRET_KEY"]
if not SECRET_KEY:
    if PRODUCTION:
        raise ConfigError("DJANGO_SECRET_KEY must be set in production (or DJANGO_SECRET_KEY_FILE).")
    SECRET_KEY = DEVELOPMENT_SECRET_KEY
DEBUG = _web["DEBUG"]
ALLOWED_HOSTS = _web["ALLOWED_HOSTS"]
if PRODUCTION and not ALLOWED_HOSTS:
    raise ConfigError("DJANGO_ALLOWED_HOSTS must list the server's host names in production.")
CSRF_TRUSTED_ORIGINS = _web["CSRF_TRUSTED_ORIGINS"]

# The address runners and signed URLs use to reach this server.
PUBLIC_URL = _web["PUBLIC_URL"]
# Where jobs' web apps are served, each on an origin of its own (None: not served).
APPS = apps_origin_parse(_web["APPS_URL"])

# --- HTTPS and browser hardening (docs/decisions/0041-https-and-csp.md) -----
# On in production: the site is served over HTTPS, directly or by a proxy that
# terminates TLS; cookies are secure-only, plain HTTP is redirected, HSTS is sent.
HTTPS = _web["HTTPS"]
if HTTPS and not PUBLIC_URL.startswith("https://"):
    raise ConfigError(
        f"TRAINYARD_PUBLIC_URL is {PUBLIC_URL}, but the site is served over HTTPS (TRAINYARD_HTTPS, on in "
        "production): set TRAINYARD_PUBLIC_URL=https://<host>, or TRAINYARD_HTTPS=false to serve plain HTTP."
    )
if APPS is not None:
    apps_origin_check(APPS, public_url=PUBLIC_URL, https=HTTPS, trusted_origins=CSRF_TRUSTED_ORIGINS)
SESSION_COOKIE_SECURE = HTTPS
CSRF_COOKIE_SECURE = HTTPS
SECURE_SSL_REDIRECT = HTTPS
# Load balancers probe the health endpoint over plain HTTP.
SECURE_REDIRECT_EXEMPT = [r"^api/v1/health/$"]  # /healthz, /readyz, /metrics: backend/ops/middleware.py
SECURE_HSTS_SECONDS = _web["SECURE_HSTS_SECONDS"]
SECURE_HSTS_INCLUDE_SUBDOMAINS = SECURE_HSTS_SECONDS > 0
SECURE_HSTS_PRELOAD = _web["SECURE_HSTS_PRELOAD"]
if not SECURE_HSTS_PRELOAD:
    # Preloading is the operator's commitment for a whole domain, never a default.
    SILENCED_SYSTEM_CHECKS = ["security.W021"]
# The header a TLS-terminating proxy sets (and overwrites) to say the request
# came over HTTPS; empty: no proxy, trust only the connection itself.
_proxy_ssl_header = _web["PROXY_SSL_HEADER"]
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
    "backend.access.apps.AccessConfig",
    "backend.metrics.apps.MetricsConfig",
    "backend.data.apps.DataConfig",
    "backend.notify.apps.NotifyConfig",
    "backend.billing.apps.BillingConfig",
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
DB_POOL = _services["DB_POOL"]
DATABASES = {
    "default": dj_database_url.parse(
        DATABASE_URL,
        # The pool needs 0. Without it, persistent connections: the log path
        # stores a batch every few milliseconds and a new connection per batch
        # cost more than the COPY itself.
        conn_max_age=0 if DB_POOL else _services["DATABASE_CONN_MAX_AGE"],
        conn_health_checks=True,
    )
}
if DB_POOL:
    DATABASES["default"].setdefault("OPTIONS", {})["pool"] = {
        "min_size": _services["DB_POOL_MIN"],
        "max_size": _services["DB_POOL_MAX"],
        # A request waits this long for a free connection, then fails.
        "timeout": _services["DB_POOL_TIMEOUT"],
        # While Postgres is down, a reconnect is retried with backoff for this
        # long, then started again from 1 s: it is back within seconds.
        "reconnect_timeout": 5.0,
    }

# A group membership not renewed for this long is dropped by the channel layer;
# followers renew theirs (backend/runs/consumers/watch.py).
CHANNEL_GROUP_EXPIRY_SECONDS = _services["CHANNEL_GROUP_EXPIRY_SECONDS"]
CHANNEL_LAYERS = {
    "default": {
        "BACKEND": "channels_redis.core.RedisChannelLayer",
        "CONFIG": {
            # redis-py 8 reads with a 5 s socket timeout by default, the same
            # as channels_redis's blocking BZPOPMIN: an idle consumer then
            # dies with TimeoutError and drops its websocket. Read longer.
            "hosts": [{"address": REDIS_URL, "socket_timeout": 30, "socket_connect_timeout": 5}],
            "prefix": _services["CHANNEL_PREFIX"],
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
        "StallActionEnum": [("stop", "stop"), ("restart", "restart")],
        "RunOutStatusEnum": "backend.runs.models.RunStatus",
        "JobOutStatusEnum": "backend.runs.models.JobStatus",
        "NotificationKindEnum": "backend.notify.models.Kind",
    },
}

# "plain" (the default) or "json": one JSON object per line, for a log
# collector (docs/DEPLOY.md, "Logs"). In JSON, the web server's own loggers go
# through the same handler, so its access and error lines are JSON too.
_operations = _env.read(knobs.Operations)
LOG_FORMAT = _operations["LOG_FORMAT"]
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
    "root": {"handlers": ["console"], "level": _operations["LOG_LEVEL"]},
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
METRICS_TOKEN = _operations["METRICS_TOKEN"]
# Shared metric values in Redis live under this prefix (the channel layer's:
# installs sharing a Redis stay apart).
METRICS_PREFIX = _services["CHANNEL_PREFIX"] + ":metrics"

# --- Sign-in ----------------------------------------------------------------
# A GitHub OAuth app (or GitHub Enterprise: set both URLs). The app's callback
# URL is <TRAINYARD_PUBLIC_URL>/auth/complete/github/.
_sign_in = _env.read(knobs.SignIn)
GITHUB_CLIENT_ID = _sign_in["GITHUB_CLIENT_ID"]
GITHUB_CLIENT_SECRET = _sign_in["GITHUB_CLIENT_SECRET"]
if bool(GITHUB_CLIENT_ID) != bool(GITHUB_CLIENT_SECRET):
    raise ConfigError("Set both GITHUB_CLIENT_ID and GITHUB_CLIENT_SECRET (or GITHUB_CLIENT_SECRET_FILE), or neither.")
GITHUB_URL = _sign_in["GITHUB_URL"]
GITHUB_API_URL = _sign_in["GITHUB_API_URL"]
# The local password login (user `admin`, see ensure_admin): the embedded
# default's way in when no GitHub app is configured.
TRAINYARD_LOCAL_LOGIN = _sign_in["TRAINYARD_LOCAL_LOGIN"]
# Who may sign in with GitHub: logins, `id:<GitHub user id>` and `org:<name>`
# (active members of that organization; asks GitHub for read:org),
# lowercased. Empty: every GitHub user. Checked at each sign-in
# (backend/accounts/pipeline.py) and re-checked periodically; required at
# start while the local backend is on (see the end of this file).
TRAINYARD_GITHUB_ALLOW = _sign_in["TRAINYARD_GITHUB_ALLOW"]
# Every GitHub account is checked against it again this often (a beat task,
# backend/accounts/services/allowlist.py): leaving the organization ends access.
TRAINYARD_GITHUB_ALLOW_RECHECK_SECONDS = _sign_in["TRAINYARD_GITHUB_ALLOW_RECHECK_SECONDS"]

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
# The sign-in start is a POST with the CSRF token (the dashboard's button is a
# form), so no other site can start a sign-in in a visitor's browser.
# social-auth-app-django 6 and later require it whatever this says (its
# `auth` view is POST-only, and backend.accounts.views wraps it); said here
# too, for an older one and for whoever audits the settings.
SOCIAL_AUTH_REQUIRE_POST = True

# Django's email backend (SMTP): notifications by email (backend/notify).
_email = _env.read(knobs.Email)
EMAIL_HOST = _email["EMAIL_HOST"]
EMAIL_PORT = _email["EMAIL_PORT"]
EMAIL_HOST_USER = _email["EMAIL_HOST_USER"]
EMAIL_HOST_PASSWORD = _email["EMAIL_HOST_PASSWORD"]
EMAIL_USE_TLS = _email["EMAIL_USE_TLS"]
DEFAULT_FROM_EMAIL = _email["DEFAULT_FROM_EMAIL"]
EMAIL_TIMEOUT = 10

# --- Trainyard ------------------------------------------------------------
# settings.TRAINYARD: a plain dict, typed and declared in knobs.py (its
# production topics and, apart, its test hooks, which production refuses).
TRAINYARD: knobs.TrainyardSettings = _env.read(knobs.TrainyardSettings)
if PRODUCTION:
    knobs.refuse_test_hooks(TRAINYARD)

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
# Local jobs run as the server's OS user: they can read /proc/<server>/environ
# (the secret keys, the database URL) and each other's files. Only an
# installation whose users trust each other may run them in production.
if PRODUCTION and TRAINYARD["LOCAL_BACKEND_ENABLED"] and not TRAINYARD["SINGLE_TENANT"]:
    raise ConfigError(
        "TRAINYARD_LOCAL_BACKEND is on in production, where jobs of every workspace would run as the server's"
        " user on its host and could read its keys and database password. Turn it off"
        " (TRAINYARD_LOCAL_BACKEND=false), or, if every user of this installation is trusted (one person or one"
        " team), declare it single-tenant with TRAINYARD_SINGLE_TENANT=true."
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
    "data-snapshots-prune": {"task": "backend.data.tasks.snapshots_prune", "schedule": timedelta(hours=1)},
    # Volumes left attached to a machine that ended or a job that is over; deletes not confirmed; lost ones.
    "volumes-reconcile": {"task": "backend.clouds.tasks.volumes_reconcile", "schedule": timedelta(seconds=30)},
    # Expired grants, terminals not reattached within the grace, idle sessions.
    "sessions-sweep": {"task": "backend.access.tasks.sessions_sweep", "schedule": timedelta(seconds=5)},
    "submission-keys-expire": {"task": "backend.runs.tasks.submission_keys_expire", "schedule": timedelta(hours=1)},
    "logs-archive": {"task": "backend.runs.tasks.logs_archive", "schedule": timedelta(seconds=30)},
    "metrics-compact": {
        "task": "backend.metrics.tasks.metrics_compact",
        "schedule": timedelta(seconds=TRAINYARD["METRICS_COMPACT_SECONDS"]),
    },
    # Jobs whose GPUs stayed idle (utilization_policy) or that stopped printing (stall).
    "jobs-guard": {
        "task": "backend.runs.tasks.jobs_guard",
        "schedule": timedelta(seconds=TRAINYARD["GUARD_CHECK_SECONDS"]),
    },
    # Budgets over the running jobs: the 80 % / 100 % notices and the budget's stop (docs/COST.md).
    "budgets-enforce": {
        "task": "backend.runs.tasks.budgets_enforce",
        "schedule": timedelta(seconds=TRAINYARD["BUDGET_CHECK_SECONDS"]),
    },
    "dev-environments-idle": {
        "task": "backend.access.tasks.dev_environments_idle",
        "schedule": timedelta(seconds=TRAINYARD["DEV_IDLE_CHECK_SECONDS"]),
    },
    "storage-gc": {
        "task": "backend.artifacts.tasks.storage_gc",
        "schedule": timedelta(seconds=TRAINYARD["GC_EVERY_SECONDS"]),
    },
    # Artifact copies to a workflow's ``to:`` that are due: retries, and those a worker dropped.
    "artifact-exports-sweep": {
        "task": "backend.artifacts.tasks.artifact_exports_sweep",
        "schedule": timedelta(seconds=TRAINYARD["EXPORT_SWEEP_SECONDS"]),
    },
    # Notification deliveries that are due: retries, and those a worker dropped.
    "notify-sweep": {
        "task": "backend.notify.tasks.deliveries_sweep",
        "schedule": timedelta(seconds=TRAINYARD["NOTIFY_SWEEP_SECONDS"]),
    },
    # A pass every half interval re-checks the accounts not checked for half
    # of one: none goes a whole interval unchecked.
    "github-allow-recheck": {
        "task": "backend.accounts.tasks.github_allow_recheck",
        "schedule": timedelta(seconds=max(60.0, TRAINYARD_GITHUB_ALLOW_RECHECK_SECONDS / 2)),
    },
}
