"""Readiness: can this process serve? The database answers, every migration
on disk is applied, and Redis (the channel layer and the Celery broker)
answers. Each check opens its own connection with a short timeout, so a
server that stopped answering makes the probe fail fast instead of hanging,
and the checks run side by side: the probe takes the slowest one's time."""

from __future__ import annotations

import functools
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import psycopg
import redis
from django.conf import settings

TIMEOUT_SECONDS = 2
# Options dj-database-url or Django put in OPTIONS that are not libpq's.
DJANGO_ONLY_OPTIONS = {"pool", "server_side_binding", "isolation_level", "assume_role", "cursor_factory"}


@dataclass(frozen=True)
class Check:
    name: str
    error: str = ""  # empty: passed

    @property
    def ok(self) -> bool:
        return not self.error


def readiness() -> list[Check]:
    """The database, migrations and Redis checks, in that order."""
    with ThreadPoolExecutor(max_workers=2, thread_name_prefix="readyz") as pool:
        database = pool.submit(_database_and_migrations)
        cache = pool.submit(_redis)
        return [*database.result(), cache.result()]


def _database_and_migrations() -> list[Check]:
    try:
        with psycopg.connect(**_libpq_params(), connect_timeout=TIMEOUT_SECONDS, autocommit=True) as conn:
            conn.execute(f"SET statement_timeout = {TIMEOUT_SECONDS * 1000}")
            applied = _applied(conn)
    except psycopg.Error as exc:
        return [Check("database", _one_line(exc)), Check("migrations", "not checked: the database is unreachable")]
    missing = sorted(_on_disk() - applied)
    if not missing:
        return [Check("database"), Check("migrations")]
    names = ", ".join(f"{app}.{name}" for app, name in missing[:5])
    more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
    error = f"{len(missing)} not applied: {names}{more}; run `manage.py migrate`"
    return [Check("database"), Check("migrations", error)]


def _redis() -> Check:
    client = redis.Redis.from_url(
        settings.REDIS_URL, socket_timeout=TIMEOUT_SECONDS, socket_connect_timeout=TIMEOUT_SECONDS
    )
    try:
        client.ping()
    except redis.RedisError as exc:
        return Check("redis", _one_line(exc))
    finally:
        client.close()
    return Check("redis")


def _applied(conn: psycopg.Connection[Any]) -> set[tuple[str, str]]:
    exists = conn.execute("SELECT to_regclass('django_migrations') IS NOT NULL").fetchone()
    if not exists or not exists[0]:
        return set()
    return {(app, name) for app, name in conn.execute("SELECT app, name FROM django_migrations")}


@functools.cache
def _on_disk() -> frozenset[tuple[str, str]]:
    """Every migration this code ships (read once per process: it cannot change under it)."""
    from django.db.migrations.loader import MigrationLoader

    return frozenset(MigrationLoader(None, ignore_no_migrations=True).disk_migrations)


def _libpq_params() -> dict[str, Any]:
    db = settings.DATABASES["default"]
    params = {
        "dbname": db.get("NAME"),
        "user": db.get("USER"),
        "password": db.get("PASSWORD"),
        "host": db.get("HOST"),
        "port": db.get("PORT"),
        **{k: v for k, v in db.get("OPTIONS", {}).items() if k not in DJANGO_ONLY_OPTIONS},
    }
    return {k: v for k, v in params.items() if v not in (None, "")}


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text[:500]
