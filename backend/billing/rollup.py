"""The cost rollup, kept by Postgres itself (docs/COST.md, "How reports are
read"; docs/decisions: the cost rollup).

Rule: ``billing_costday`` holds, per (workspace, UTC day, kind, submitter,
workflow, backend), the sum of every **settled** cost: an attempt's once it
has ended or its machine has (``kind`` "a", bucketed by the day it
started), a machine's idle share once it has terminated (``kind`` "i",
bucketed by the day it started running; each machine's own share is kept in
``billing_machineidle``). What is still accruing — an open attempt on a live
machine, a live machine's idle share — is never in it: a report adds those,
computed at ``now``. The arithmetic is ``backend.billing.rules``' exactly
(whole seconds rounded half to even, a machine's seconds rounded up with its
60 s minimum, money rounded half up to a hundredth of a cent), in integer
arithmetic, so a settled cost equals the row-by-row one to the last digit.

Triggers keep it in the transaction that changes what a cost rests on: an
attempt's times, machine, job (``runs_attempt``), a machine's price, times,
backend (``clouds_instance``), a run's submitter or workflow (``runs_run``).
Ending an attempt writes one rollup row; terminating a machine writes its
idle share and its bucket (and the buckets of attempts it cut short).

Concurrency: a change to an attempt's settled cost takes its machine's row
lock (``FOR NO KEY UPDATE``, the lock an UPDATE of the machine takes), so
the attempt's and its machine's triggers never read each other's state
half-done; buckets are summed with ``INSERT … ON CONFLICT DO UPDATE`` (two
attempts ending at once each add their own share). Each bucket also keeps
the earliest and latest start it ever counted (only widened), so a report
whose window cuts its first or last day uses that day's buckets whole when
the cut misses them, and reads that day's rows otherwise (a day inside the
window is always whole)."""

from __future__ import annotations

# The rules of backend.billing.rules in SQL (seconds and money).
FUNCTIONS = r"""
-- rules.held_seconds: end = finished, else the machine's end, else now; never past the machine's end;
-- whole seconds rounded half to even (Python's round() of the float seconds).
CREATE OR REPLACE FUNCTION billing_held_seconds(
  started timestamptz, finished timestamptz, terminated timestamptz, now timestamptz
) RETURNS bigint LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
  us numeric;
  q numeric;
BEGIN
  IF started IS NULL THEN RETURN 0; END IF;
  us := (extract(epoch FROM LEAST(COALESCE(finished, terminated, now), terminated)) - extract(epoch FROM started))
    * 1000000;
  IF us <= 0 THEN RETURN 0; END IF;
  q := div(us, 1000000);
  IF us - q * 1000000 > 500000 OR (us - q * 1000000 = 500000 AND mod(q, 2) = 1) THEN q := q + 1; END IF;
  RETURN q;
END $$;

-- rules.machine_seconds: running_at to terminated_at (else now), rounded up, at least 60 s; 0 if it never ran.
CREATE OR REPLACE FUNCTION billing_machine_seconds(running timestamptz, terminated timestamptz, now timestamptz)
RETURNS bigint LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
BEGIN
  IF running IS NULL THEN RETURN 0; END IF;
  RETURN GREATEST(60, div(GREATEST((extract(epoch FROM COALESCE(terminated, now)) - extract(epoch FROM running))
    * 1000000, 0) + 999999, 1000000));
END $$;

-- rules.cost_of: price x seconds / 3600, rounded half up (away from zero) to 0.0001.
CREATE OR REPLACE FUNCTION billing_cost(price numeric, seconds bigint) RETURNS numeric
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE AS $$
DECLARE
  n numeric := price * 1000000 * seconds;
BEGIN
  RETURN div(2 * n + sign(n) * 360000, 720000) * 0.0001;
END $$;

CREATE OR REPLACE FUNCTION billing_day(t timestamptz) RETURNS date
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$ SELECT (t AT TIME ZONE 'UTC')::date $$;

CREATE OR REPLACE FUNCTION billing_add(
  ws uuid, d date, k char, uid bigint, wf varchar, be varchar, amount numeric, n integer, at timestamptz
) RETURNS void LANGUAGE sql AS $$
  INSERT INTO billing_costday AS c (workspace_id, day, kind, user_id, workflow, backend, cost, items, first_at, last_at)
  VALUES (ws, d, k, uid, wf, be, amount, n, at, at)
  ON CONFLICT (workspace_id, day, kind, user_id, workflow, backend) DO UPDATE
  SET cost = c.cost + EXCLUDED.cost, items = c.items + EXCLUDED.items,
      first_at = LEAST(c.first_at, EXCLUDED.first_at), last_at = GREATEST(c.last_at, EXCLUDED.last_at)
$$;

-- One attempt's settled cost, added with sign +1 or taken back with -1, given its row's values and its
-- machine's and run's current rows. Nothing while it is unsettled (open on a live machine).
CREATE OR REPLACE FUNCTION billing_apply_attempt(
  sgn integer, ws uuid, job uuid, inst uuid, started timestamptz, finished timestamptz
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  m record;
  r record;
BEGIN
  IF started IS NULL OR inst IS NULL THEN RETURN; END IF;
  SELECT price_per_hour, terminated_at, backend INTO m FROM clouds_instance WHERE id = inst;
  IF NOT FOUND OR (finished IS NULL AND m.terminated_at IS NULL) THEN RETURN; END IF;
  SELECT rr.submitted_by_id, rr.workflow INTO r FROM runs_job j JOIN runs_run rr ON rr.id = j.run_id WHERE j.id = job;
  PERFORM billing_add(ws, billing_day(started), 'a', COALESCE(r.submitted_by_id, 0), COALESCE(r.workflow, ''),
    m.backend, sgn * billing_cost(m.price_per_hour, billing_held_seconds(started, finished, m.terminated_at, NULL)),
    sgn, started);
END $$;

-- A machine's settled idle share, recomputed from its row and its attempts; the change from what was
-- counted goes to its bucket. Called with the machine's row locked.
CREATE OR REPLACE FUNCTION billing_refresh_idle(inst uuid) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
  m record;
  prev record;
  held numeric;
  idle numeric;
BEGIN
  SELECT id, workspace_id, backend, price_per_hour, running_at, terminated_at INTO m
    FROM clouds_instance WHERE id = inst;
  SELECT * INTO prev FROM billing_machineidle WHERE instance_id = inst;
  IF FOUND THEN
    PERFORM billing_add(prev.workspace_id, billing_day(prev.running_at), 'i', 0, '', prev.backend, -prev.idle, -1,
      prev.running_at);
    DELETE FROM billing_machineidle WHERE instance_id = inst;
  END IF;
  IF m.id IS NULL OR m.terminated_at IS NULL OR m.running_at IS NULL THEN RETURN; END IF;
  SELECT COALESCE(sum(billing_cost(m.price_per_hour,
      billing_held_seconds(a.started_at, a.finished_at, m.terminated_at, NULL))), 0)
    INTO held FROM runs_attempt a WHERE a.instance_id = inst;
  idle := GREATEST(0, billing_cost(m.price_per_hour, billing_machine_seconds(m.running_at, m.terminated_at, NULL))
    - held);
  INSERT INTO billing_machineidle (instance_id, workspace_id, backend, running_at, idle)
    VALUES (inst, m.workspace_id, m.backend, m.running_at, idle);
  PERFORM billing_add(m.workspace_id, billing_day(m.running_at), 'i', 0, '', m.backend, idle, 1, m.running_at);
END $$;

CREATE OR REPLACE FUNCTION billing_attempt_changed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  -- The machines' rows, locked in a fixed order: their state is what the costs rest on.
  PERFORM 1 FROM clouds_instance
    WHERE id IN (CASE WHEN TG_OP <> 'INSERT' THEN OLD.instance_id END,
                 CASE WHEN TG_OP <> 'DELETE' THEN NEW.instance_id END)
    ORDER BY id FOR NO KEY UPDATE;
  IF TG_OP <> 'INSERT' THEN
    PERFORM billing_apply_attempt(-1, OLD.workspace_id, OLD.job_id, OLD.instance_id, OLD.started_at, OLD.finished_at);
  END IF;
  IF TG_OP <> 'DELETE' THEN
    PERFORM billing_apply_attempt(1, NEW.workspace_id, NEW.job_id, NEW.instance_id, NEW.started_at, NEW.finished_at);
  END IF;
  -- A terminated machine's idle share is what its attempts left: it moves with them.
  IF TG_OP <> 'INSERT' AND OLD.instance_id IS NOT NULL
     AND EXISTS (SELECT 1 FROM billing_machineidle WHERE instance_id = OLD.instance_id) THEN
    PERFORM billing_refresh_idle(OLD.instance_id);
  END IF;
  IF TG_OP <> 'DELETE' AND NEW.instance_id IS NOT NULL
     AND (TG_OP = 'INSERT' OR NEW.instance_id IS DISTINCT FROM OLD.instance_id)
     AND EXISTS (SELECT 1 FROM billing_machineidle WHERE instance_id = NEW.instance_id) THEN
    PERFORM billing_refresh_idle(NEW.instance_id);
  END IF;
  RETURN NULL;
END $$;

-- A machine's change re-settles its attempts (each taken back at the old state, added at the new one)
-- and its idle share.
CREATE OR REPLACE FUNCTION billing_instance_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  a record;
  r record;
  was numeric;
  now_settled boolean;
  was_settled boolean;
BEGIN
  IF TG_OP = 'UPDATE' THEN
    FOR a IN SELECT id, workspace_id, job_id, started_at, finished_at FROM runs_attempt
             WHERE instance_id = NEW.id AND started_at IS NOT NULL LOOP
      was_settled := a.finished_at IS NOT NULL OR OLD.terminated_at IS NOT NULL;
      now_settled := a.finished_at IS NOT NULL OR NEW.terminated_at IS NOT NULL;
      CONTINUE WHEN NOT was_settled AND NOT now_settled;
      was := billing_cost(OLD.price_per_hour,
        billing_held_seconds(a.started_at, a.finished_at, OLD.terminated_at, NULL));
      CONTINUE WHEN was_settled AND now_settled AND OLD.backend = NEW.backend AND was = billing_cost(
        NEW.price_per_hour, billing_held_seconds(a.started_at, a.finished_at, NEW.terminated_at, NULL));
      SELECT rr.submitted_by_id, rr.workflow INTO r FROM runs_job j JOIN runs_run rr ON rr.id = j.run_id
        WHERE j.id = a.job_id;
      IF was_settled THEN
        PERFORM billing_add(a.workspace_id, billing_day(a.started_at), 'a', COALESCE(r.submitted_by_id, 0),
          COALESCE(r.workflow, ''), OLD.backend, -was, -1, a.started_at);
      END IF;
      IF now_settled THEN
        PERFORM billing_add(a.workspace_id, billing_day(a.started_at), 'a', COALESCE(r.submitted_by_id, 0),
          COALESCE(r.workflow, ''), NEW.backend, billing_cost(NEW.price_per_hour,
          billing_held_seconds(a.started_at, a.finished_at, NEW.terminated_at, NULL)), 1, a.started_at);
      END IF;
    END LOOP;
  END IF;
  PERFORM billing_refresh_idle(CASE WHEN TG_OP = 'DELETE' THEN OLD.id ELSE NEW.id END);
  RETURN NULL;
END $$;

-- A run's submitter or workflow names its attempts' buckets: they move with it.
CREATE OR REPLACE FUNCTION billing_run_changed() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
  a record;
  cost numeric;
BEGIN
  FOR a IN SELECT at.workspace_id, at.started_at, at.finished_at, m.price_per_hour, m.terminated_at, m.backend
           FROM runs_attempt at JOIN runs_job j ON j.id = at.job_id JOIN clouds_instance m ON m.id = at.instance_id
           WHERE j.run_id = NEW.id AND at.started_at IS NOT NULL
             AND (at.finished_at IS NOT NULL OR m.terminated_at IS NOT NULL) LOOP
    cost := billing_cost(a.price_per_hour, billing_held_seconds(a.started_at, a.finished_at, a.terminated_at, NULL));
    PERFORM billing_add(a.workspace_id, billing_day(a.started_at), 'a', COALESCE(OLD.submitted_by_id, 0),
      OLD.workflow, a.backend, -cost, -1, a.started_at);
    PERFORM billing_add(a.workspace_id, billing_day(a.started_at), 'a', COALESCE(NEW.submitted_by_id, 0),
      NEW.workflow, a.backend, cost, 1, a.started_at);
  END LOOP;
  RETURN NULL;
END $$;
"""

TRIGGERS = r"""
CREATE TRIGGER billing_attempt_added AFTER INSERT ON runs_attempt
  FOR EACH ROW WHEN (NEW.started_at IS NOT NULL AND NEW.instance_id IS NOT NULL)
  EXECUTE FUNCTION billing_attempt_changed();
CREATE TRIGGER billing_attempt_updated AFTER UPDATE ON runs_attempt
  FOR EACH ROW WHEN (OLD.started_at IS DISTINCT FROM NEW.started_at OR OLD.finished_at IS DISTINCT FROM NEW.finished_at
    OR OLD.instance_id IS DISTINCT FROM NEW.instance_id OR OLD.job_id IS DISTINCT FROM NEW.job_id
    OR OLD.workspace_id IS DISTINCT FROM NEW.workspace_id)
  EXECUTE FUNCTION billing_attempt_changed();
CREATE TRIGGER billing_attempt_removed AFTER DELETE ON runs_attempt
  FOR EACH ROW WHEN (OLD.started_at IS NOT NULL AND OLD.instance_id IS NOT NULL)
  EXECUTE FUNCTION billing_attempt_changed();
CREATE TRIGGER billing_instance_added AFTER INSERT ON clouds_instance
  FOR EACH ROW WHEN (NEW.terminated_at IS NOT NULL AND NEW.running_at IS NOT NULL)
  EXECUTE FUNCTION billing_instance_changed();
CREATE TRIGGER billing_instance_updated AFTER UPDATE ON clouds_instance
  FOR EACH ROW WHEN (OLD.price_per_hour IS DISTINCT FROM NEW.price_per_hour
    OR OLD.running_at IS DISTINCT FROM NEW.running_at OR OLD.terminated_at IS DISTINCT FROM NEW.terminated_at
    OR OLD.backend IS DISTINCT FROM NEW.backend OR OLD.workspace_id IS DISTINCT FROM NEW.workspace_id)
  EXECUTE FUNCTION billing_instance_changed();
CREATE TRIGGER billing_instance_removed AFTER DELETE ON clouds_instance
  FOR EACH ROW EXECUTE FUNCTION billing_instance_changed();
CREATE TRIGGER billing_run_updated AFTER UPDATE ON runs_run
  FOR EACH ROW WHEN (OLD.submitted_by_id IS DISTINCT FROM NEW.submitted_by_id
    OR OLD.workflow IS DISTINCT FROM NEW.workflow)
  EXECUTE FUNCTION billing_run_changed();
"""

# What a report reads besides the rollup: the open attempts of a window, the live machines, a cut day's rows.
INDEXES = r"""
CREATE INDEX IF NOT EXISTS billing_attempt_ws_started ON runs_attempt (workspace_id, started_at);
CREATE INDEX IF NOT EXISTS billing_attempt_open ON runs_attempt (workspace_id, started_at) WHERE finished_at IS NULL;
CREATE INDEX IF NOT EXISTS billing_instance_live ON clouds_instance (workspace_id, running_at)
  WHERE terminated_at IS NULL;
"""

# Everything settled, summed afresh from the rows: the migration's backfill, and a repair.
REBUILD = r"""
DELETE FROM billing_costday;
DELETE FROM billing_machineidle;
INSERT INTO billing_costday (workspace_id, day, kind, user_id, workflow, backend, cost, items, first_at, last_at)
SELECT a.workspace_id, billing_day(a.started_at), 'a', COALESCE(r.submitted_by_id, 0), r.workflow, m.backend,
       sum(billing_cost(m.price_per_hour, billing_held_seconds(a.started_at, a.finished_at, m.terminated_at, NULL))),
       count(*), min(a.started_at), max(a.started_at)
FROM runs_attempt a JOIN clouds_instance m ON m.id = a.instance_id
  JOIN runs_job j ON j.id = a.job_id JOIN runs_run r ON r.id = j.run_id
WHERE a.started_at IS NOT NULL AND (a.finished_at IS NOT NULL OR m.terminated_at IS NOT NULL)
GROUP BY 1, 2, 3, 4, 5, 6;
INSERT INTO billing_machineidle (instance_id, workspace_id, backend, running_at, idle)
SELECT m.id, m.workspace_id, m.backend, m.running_at,
       GREATEST(0, billing_cost(m.price_per_hour, billing_machine_seconds(m.running_at, m.terminated_at, NULL))
         - COALESCE(h.held, 0))
FROM clouds_instance m LEFT JOIN (
  SELECT a.instance_id, sum(billing_cost(i.price_per_hour,
           billing_held_seconds(a.started_at, a.finished_at, i.terminated_at, NULL))) AS held
  FROM runs_attempt a JOIN clouds_instance i ON i.id = a.instance_id
  WHERE i.terminated_at IS NOT NULL AND i.running_at IS NOT NULL GROUP BY a.instance_id
) h ON h.instance_id = m.id
WHERE m.terminated_at IS NOT NULL AND m.running_at IS NOT NULL;
INSERT INTO billing_costday (workspace_id, day, kind, user_id, workflow, backend, cost, items, first_at, last_at)
SELECT workspace_id, billing_day(running_at), 'i', 0, '', backend, sum(idle), count(*), min(running_at),
       max(running_at)
FROM billing_machineidle GROUP BY 1, 2, 3, 4, 5, 6;
"""

REMOVE = r"""
DROP TRIGGER IF EXISTS billing_attempt_added ON runs_attempt;
DROP TRIGGER IF EXISTS billing_attempt_updated ON runs_attempt;
DROP TRIGGER IF EXISTS billing_attempt_removed ON runs_attempt;
DROP TRIGGER IF EXISTS billing_instance_added ON clouds_instance;
DROP TRIGGER IF EXISTS billing_instance_updated ON clouds_instance;
DROP TRIGGER IF EXISTS billing_instance_removed ON clouds_instance;
DROP TRIGGER IF EXISTS billing_run_updated ON runs_run;
DROP FUNCTION IF EXISTS billing_run_changed();
DROP FUNCTION IF EXISTS billing_instance_changed();
DROP FUNCTION IF EXISTS billing_attempt_changed();
DROP FUNCTION IF EXISTS billing_refresh_idle(uuid);
DROP FUNCTION IF EXISTS billing_apply_attempt(integer, uuid, uuid, uuid, timestamptz, timestamptz);
DROP FUNCTION IF EXISTS billing_add(uuid, date, char, bigint, varchar, varchar, numeric, integer, timestamptz);
DROP FUNCTION IF EXISTS billing_day(timestamptz);
DROP FUNCTION IF EXISTS billing_cost(numeric, bigint);
DROP FUNCTION IF EXISTS billing_machine_seconds(timestamptz, timestamptz, timestamptz);
DROP FUNCTION IF EXISTS billing_held_seconds(timestamptz, timestamptz, timestamptz, timestamptz);
DROP INDEX IF EXISTS billing_attempt_ws_started;
DROP INDEX IF EXISTS billing_attempt_open;
DROP INDEX IF EXISTS billing_instance_live;
"""

# The window's costs, in one statement (one snapshot): the rollup's buckets the window holds whole, a cut
# day's settled rows, the open attempts and the live machines at %(now)s. Rows: (kind, workspace, user,
# workflow, backend, day, cost, items); ``kind`` "a" an attempt's, "i" a machine's idle share. An attempt's
# run is looked up per row (LATERAL), so a window with no cut day never reads the runs or jobs whole.
WINDOW = r"""
WITH cut AS (
  SELECT DISTINCT workspace_id, day, kind, (day::timestamp AT TIME ZONE 'UTC') AS day_start FROM billing_costday
  WHERE workspace_id = ANY(%(ws)s) AND day IN (%(first_day)s, %(last_day)s)
    AND NOT (first_at >= %(since)s AND last_at < %(until)s)
), parts AS (
  SELECT kind, workspace_id, user_id, workflow, backend, day, cost, items FROM billing_costday
  WHERE workspace_id = ANY(%(ws)s) AND day > %(first_day)s AND day < %(last_day)s
  UNION ALL
  SELECT b.kind, b.workspace_id, b.user_id, b.workflow, b.backend, b.day, b.cost, b.items FROM billing_costday b
  WHERE b.workspace_id = ANY(%(ws)s) AND b.day IN (%(first_day)s, %(last_day)s)
    AND NOT EXISTS (SELECT 1 FROM cut WHERE cut.workspace_id = b.workspace_id AND cut.day = b.day AND cut.kind = b.kind)
  UNION ALL
  SELECT 'a', a.workspace_id, COALESCE(r.submitted_by_id, 0), r.workflow, m.backend, cut.day,
         billing_cost(m.price_per_hour, billing_held_seconds(a.started_at, a.finished_at, m.terminated_at, NULL)), 1
  FROM cut JOIN runs_attempt a ON a.workspace_id = cut.workspace_id
    AND a.started_at >= GREATEST(%(since)s, cut.day_start) AND a.started_at < LEAST(%(until)s, cut.day_start + '1 day')
    JOIN clouds_instance m ON m.id = a.instance_id
    CROSS JOIN LATERAL (SELECT rr.submitted_by_id, rr.workflow FROM runs_job j JOIN runs_run rr ON rr.id = j.run_id
                        WHERE j.id = a.job_id OFFSET 0) r
  WHERE cut.kind = 'a' AND (a.finished_at IS NOT NULL OR m.terminated_at IS NOT NULL)
  UNION ALL
  SELECT 'i', i.workspace_id, 0, '', i.backend, cut.day, i.idle, 1
  FROM cut JOIN billing_machineidle i ON i.workspace_id = cut.workspace_id
    AND i.running_at >= GREATEST(%(since)s, cut.day_start) AND i.running_at < LEAST(%(until)s, cut.day_start + '1 day')
  WHERE cut.kind = 'i'
  UNION ALL
  SELECT 'a', a.workspace_id, COALESCE(r.submitted_by_id, 0), r.workflow, m.backend, billing_day(a.started_at),
         billing_cost(m.price_per_hour, billing_held_seconds(a.started_at, NULL, NULL, %(now)s)), 1
  FROM runs_attempt a JOIN clouds_instance m ON m.id = a.instance_id
    CROSS JOIN LATERAL (SELECT rr.submitted_by_id, rr.workflow FROM runs_job j JOIN runs_run rr ON rr.id = j.run_id
                        WHERE j.id = a.job_id OFFSET 0) r
  WHERE a.workspace_id = ANY(%(ws)s) AND a.finished_at IS NULL AND a.started_at >= %(since)s
    AND a.started_at < %(until)s AND m.terminated_at IS NULL
  UNION ALL
  SELECT 'i', m.workspace_id, 0, '', m.backend, billing_day(m.running_at),
         GREATEST(0, billing_cost(m.price_per_hour, billing_machine_seconds(m.running_at, NULL, %(now)s))
           - (SELECT COALESCE(sum(billing_cost(m.price_per_hour,
                billing_held_seconds(a.started_at, a.finished_at, NULL, %(now)s))), 0)
              FROM runs_attempt a WHERE a.instance_id = m.id)), 1
  FROM clouds_instance m
  WHERE m.workspace_id = ANY(%(ws)s) AND m.terminated_at IS NULL AND m.running_at >= %(since)s
    AND m.running_at < %(until)s
)
SELECT kind, workspace_id, {key}, sum(cost), sum(items) FROM parts GROUP BY 1, 2, 3
"""

# How a report's rows are keyed (``{key}`` above); "user" is resolved to usernames by the caller.
GROUPINGS = {
    "user": "user_id",
    "workflow": "workflow",
    "backend": "backend",
    "day": "to_char(day, 'YYYY-MM-DD')",
    "week": "to_char(date_trunc('week', day), 'YYYY-MM-DD')",
    "month": "to_char(day, 'YYYY-MM')",
}
