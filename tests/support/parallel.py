"""Each pytest-xdist worker's own Redis databases and data directory.

``make test`` runs the suite in ``-n 2`` workers (docs/decisions/0068).
The workers share the session's Postgres and Valkey servers, so each needs
its own share of them: pytest-django gives each its own test database
(``test_<name>_gw<N>``) by itself; this plugin gives each its own Redis
database for the process (``REDIS_URL``) and for the end-to-end stack
(``TRAINYARD_E2E_REDIS_DB``), and its own ``TRAINYARD_DATA_DIR``.

Loaded with ``-p`` (pytest.ini), so it runs before pytest-django reads
the settings, which read these variables once. xdist sets
``PYTEST_XDIST_WORKER`` in a worker's environment before its pytest starts;
outside xdist (``-n 0``, or no ``-n``) this changes nothing.

In a worker it also puts the files with slow tests first
(``pytest_collection_modifyitems``).
"""

from __future__ import annotations

import os

import pytest

from tests.support.urls import url_with_path

# Worker N takes Redis databases FIRST_DB + 2N (its own) and FIRST_DB + 2N + 1
# (its stack's); Valkey has 16, and a run without xdist uses its URL's and 5.
FIRST_DB = 6
MAX_WORKERS = 5


def _worker_number() -> int | None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    if not worker.startswith("gw"):
        return None
    number = int(worker[2:])
    if number >= MAX_WORKERS:
        raise RuntimeError(f"at most {MAX_WORKERS} test workers (-n): Valkey has 16 databases; asked for {worker}")
    return number


def worker_environment(environ: dict[str, str], number: int) -> dict[str, str]:
    """What worker ``number`` changes in ``environ``."""
    changed = {
        "TRAINYARD_E2E_REDIS_DB": str(FIRST_DB + 2 * number + 1),
    }
    if environ.get("REDIS_URL"):
        changed["REDIS_URL"] = url_with_path(environ["REDIS_URL"], FIRST_DB + 2 * number)
    if environ.get("TRAINYARD_DATA_DIR"):
        changed["TRAINYARD_DATA_DIR"] = os.path.join(environ["TRAINYARD_DATA_DIR"], f"gw{number}")
    return changed


_number = _worker_number()
if _number is not None:
    os.environ.update(worker_environment(dict(os.environ), _number))
    if os.environ.get("TRAINYARD_DATA_DIR"):
        os.makedirs(os.environ["TRAINYARD_DATA_DIR"], exist_ok=True)


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In an xdist worker (decision 0068): files with slow (end-to-end) tests
    first, then the rest, each part in pytest-django's order. A file is the
    unit of work, handed out in this order (``--no-loadscope-reorder``): the
    long files start early and the short unit-test files fill in at the end,
    so neither worker is left with a 5-minute file while the other is done.
    xdist's own order (most tests first) put the end-to-end files last. One
    process keeps pytest-django's order."""
    if not hasattr(config, "workerinput"):
        return
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)
