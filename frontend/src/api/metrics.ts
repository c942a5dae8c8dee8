// The metrics API (docs/METRICS.md, "API"): a run's jobs and their metric
// names, one job's series (ranged, downsampled by the server), and runs compared.
import { get, wsPath } from "./client";
import type { components } from "./schema";

// The shapes are the generated schema's (schema.d.ts, from backend/metrics/api.py).
type Schemas = components["schemas"];

/** One attempt of a job: `termination_reason` is "" while it runs (the attempts table's reasons). */
export type MetricAttempt = Schemas["MetricsAttemptOut"];
/** A metric's newest value: `step` for a training value the job gave one; `t` when it was taken. */
export type LastValue = Schemas["LastValueOut"];
/**
 * A job's series names ("cpu", "memory", "disk_used", "disk_total", "net_rx", "net_tx",
 * "gpu<i>.<util|memory|memory_total|power|temperature>"; its training metrics), last values and
 * counters: training values over the per-minute cap, metrics-file lines that were not JSON
 * objects of numbers, frames the server dropped.
 */
export type JobMetrics = Schemas["JobMetricsOut"];
export type RunMetrics = Schemas["RunMetricsOut"];
/** A series' points, column-wise: x is unix seconds (x = "time") or the step; `min`/`max` for system series. */
export type SeriesPoints = Schemas["MetricPointsOut"];
/** `resolution` (system series): "raw", "1m" (the stored per-minute rollup) or "<n>s" (downsampled to fit `points`). */
export type Series = Schemas["MetricSeriesOut"];
export type SeriesAnswer = Schemas["JobSeriesOut"];
export type CompareSeries = Schemas["ComparedSeriesOut"];
/** `params`: "-e NAME" → a digest of the value (the values are secrets), "var NAME" → its value, "--" → the run's arguments; `cost`: USD or null. */
export type ComparedRun = Schemas["ComparedRunOut"];
export type CompareAnswer = Schemas["CompareOut"];

/** The most points the series endpoint returns per series (its cap). */
export const MAX_POINTS = 5000;

export function runMetrics(workspace: string, run: string): Promise<RunMetrics> {
  return get<RunMetrics>(wsPath(workspace, `runs/${encodeURIComponent(run)}/metrics/`));
}

export interface SeriesQuery {
  job: string;
  names?: string[];
  since?: number;
  until?: number;
  points?: number;
}

export function jobSeries(workspace: string, run: string, query: SeriesQuery): Promise<SeriesAnswer> {
  return get<SeriesAnswer>(wsPath(workspace, `runs/${encodeURIComponent(run)}/metrics/series/`), {
    job: query.job,
    names: query.names && query.names.length ? query.names.join(",") : undefined,
    since: query.since,
    until: query.until,
    points: query.points ? Math.min(MAX_POINTS, Math.max(1, Math.round(query.points))) : undefined,
  });
}

export function compareRuns(workspace: string, runs: string[], names?: string[]): Promise<CompareAnswer> {
  return get<CompareAnswer>(wsPath(workspace, "metrics/compare/"), {
    runs: runs.join(","),
    names: names && names.length ? names.join(",") : undefined,
  });
}
