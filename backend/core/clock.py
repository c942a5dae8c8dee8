"""The one clock liveness is measured by: the database's.

A runner's heartbeat is stamped by the web process that holds its socket,
a web process's pulse by that process, and both are judged by the
reconciler in a Celery worker, on other hosts whose clocks drift apart. A
worker whose clock ran ahead of the web hosts' by more than a pulse's
staleness saw every pulse as stale and counted no runner's silence: failure
detection was off, silently. So every liveness stamp (heartbeats, pulses,
unreachable-since, leases, the reconciler's own passes) is written with
Postgres's clock, and compared with it (decision 0086).
``Now()`` in a query is ``statement_timestamp()``; ``db_now()`` reads the
same clock into Python when a value is needed there.
"""

from __future__ import annotations

from datetime import datetime

from django.db import connection


def db_now() -> datetime:
    """The database server's time now (the start of this statement, as ``Now()``)."""
    with connection.cursor() as cur:
        cur.execute("SELECT statement_timestamp()")
        value: datetime = cur.fetchone()[0]
    return value
