"""One helper for the suite, its workers (tests/support/parallel.py) and the
bench: a URL with another path, e.g. a Postgres database name or a Redis
database number. Imports nothing of the project, so the xdist plugin can load
it before pytest-django reads the settings."""

from __future__ import annotations

from urllib.parse import urlsplit, urlunsplit


def url_with_path(url: str, path: str | int) -> str:
    """``url`` with its path replaced by ``/<path>``: ``redis://h:6379/0`` → ``redis://h:6379/7``."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{path}"))
