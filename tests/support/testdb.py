"""The database pytest-django made, for what connects to it outside Django's
connection: a subprocess (a URL) or a second psycopg connection. The
embedded Postgres of `make test` is reached through a socket directory,
which dj-database-url puts in ``OPTIONS["host"]``, not in ``HOST``."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

import psycopg
from django.db import connection


def django_test_db_params() -> dict[str, Any]:
    s = connection.settings_dict
    options = s.get("OPTIONS") or {}
    return {
        "dbname": s["NAME"],
        "user": s["USER"],
        "password": s.get("PASSWORD") or None,
        "host": str(s.get("HOST") or options.get("host") or "127.0.0.1"),
        "port": str(s.get("PORT") or options.get("port") or "5432"),
    }


def django_test_db_url() -> str:
    p = django_test_db_params()
    password = f":{quote(p['password'])}" if p["password"] else ""
    user, name = quote(str(p["user"])), p["dbname"]
    if p["host"].startswith("/"):
        return f"postgresql://{user}{password}@/{name}?host={quote(p['host'])}&port={p['port']}"
    return f"postgresql://{user}{password}@{p['host']}:{p['port']}/{name}"


def django_test_db_connect() -> psycopg.Connection[Any]:
    return psycopg.connect(**django_test_db_params())
