// The run page's Metrics tab: one job's training and system metrics as
// charts (loaded with the tab, like the terminal: uPlot is not in the main
// bundle). The whole run is read once, downsampled by the server; while the
// job runs, the points since the newest one held are read every few seconds
// and merged in. Time charts share one zoom: a drag over any of them shows that
// range on all, read again at a finer resolution; a double click, or "Whole
// run", goes back.
import { useCallback, useEffect, useMemo, useRef, useState } from "react";
import { Link } from "react-router-dom";
import { errorMessage } from "../api/client";
import { jobSeries, runMetrics, type JobMetrics, type MetricAttempt, type RunMetrics, type Series } from "../api/metrics";
import type { Job, Run } from "../api/types";
import { clockTime, reasonDescription, reasonLabel } from "../lib/attempts";
import { useInterval, useResource } from "../lib/hooks";
import {
  alignSteps,
  alignTime,
  chartSpecs,
  colorAt,
  isInterruption,
  mergeSeries,
  newestTime,
  spliceDetail,
  stepMarks,
  timeMarks,
  type ChartSpec,
} from "../lib/metrics";
import { useWorkspace } from "../workspace";
import { MetricChart, type ChartLine } from "./MetricChart";
import { ErrorBanner, Loading } from "./ui";

/** How often a running job's new points are read. */
export const POLL_MS = 4_000;
/** Points asked for per series for the whole run (the server downsamples to fit). */
export const OVERVIEW_POINTS = 1_000;
/** A `since` reaches this far before the newest point held: frames that arrive late are not missed. */
export const OVERLAP_SECONDS = 30;
/** Past this many points in one series (a long watch of a running job), the whole run is read again, downsampled. */
export const HELD_POINTS_CAP = 4_000;

const ACTIVE_JOB = new Set(["pending", "assigned", "running", "stopping"]);
const QUICK_RANGES: { label: string; seconds: number }[] = [
  { label: "15 min", seconds: 15 * 60 },
  { label: "1 h", seconds: 3600 },
  { label: "1 day", seconds: 86400 },
];

interface Held {
  job: string;
  attempts: MetricAttempt[];
  series: Map<string, Series>;
}

export function MetricsPanel({ run, job }: { run: Run; job: Job | null }) {
  const { slug } = useWorkspace();
  const active = job !== null && ACTIVE_JOB.has(job.status);
  const metrics = useResource<RunMetrics>(`${slug}/${run.name}/metrics`, () => runMetrics(slug, run.name));
  useInterval(() => void metrics.reload(), active ? POLL_MS : null);

  if (!job) return <p className="muted">This run has no jobs.</p>;
  if (job.cached_from) {
    return (
      <p className="muted">
        {job.name} was reused from <Link to={`/w/${slug}/runs/${job.cached_from.run}`}>{job.cached_from.run}</Link> (cached): its metrics are on
        that run's page.
      </p>
    );
  }
  const summary = metrics.data?.jobs.find((j) => j.job === job.name);
  // The job's series are read at once, beside the summary: the charts need only them.
  return (
    <div className="metrics-panel">
      <ErrorBanner error={metrics.error} />
      <JobCharts key={job.name} run={run} job={job} summary={summary} summaryLoaded={metrics.data !== undefined} active={active} />
    </div>
  );
}

function JobCharts({
  run,
  job,
  summary,
  summaryLoaded,
  active,
}: {
  run: Run;
  job: Job;
  summary: JobMetrics | undefined;
  summaryLoaded: boolean;
  active: boolean;
}) {
  const { slug } = useWorkspace();
  const [held, setHeld] = useState<Held | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [zoom, setZoom] = useState<[number, number] | null>(null);
  const [detail, setDetail] = useState<Map<string, Series> | null>(null);
  const [updatedAt, setUpdatedAt] = useState<number | null>(null);
  const heldRef = useRef<Held | null>(null);
  heldRef.current = held;
  const busy = useRef(false);

  const loadWhole = useCallback(async () => {
    busy.current = true;
    try {
      const answer = await jobSeries(slug, run.name, { job: job.name, points: OVERVIEW_POINTS });
      setHeld({ job: job.name, attempts: answer.attempts, series: new Map(answer.series.map((s) => [s.name, s])) });
      setUpdatedAt(Date.now());
      setError(null);
    } catch (caught) {
      setError(errorMessage(caught));
    } finally {
      busy.current = false;
    }
  }, [slug, run.name, job.name]);

  useEffect(() => void loadWhole(), [loadWhole]);

  const poll = useCallback(async () => {
    const current = heldRef.current;
    if (!current || busy.current) return;
    busy.current = true;
    try {
      const since = Math.floor((newestTime(current.series.values()) ?? Date.now() / 1000) - OVERLAP_SECONDS);
      const fresh = await jobSeries(slug, run.name, { job: job.name, since, points: OVERVIEW_POINTS });
      const merged = new Map(current.series);
      const unknown: string[] = [];
      for (const s of fresh.series) {
        if (merged.has(s.name)) merged.set(s.name, mergeSeries(merged.get(s.name), s));
        else unknown.push(s.name);
      }
      if (unknown.length) {
        // A series new since the last read: all of it, not only its newest points.
        const whole = await jobSeries(slug, run.name, { job: job.name, names: unknown, points: OVERVIEW_POINTS });
        for (const s of whole.series) merged.set(s.name, s);
      }
      setHeld({ job: job.name, attempts: fresh.attempts, series: merged });
      setUpdatedAt(Date.now());
      setError(null);
      if ([...merged.values()].some((s) => s.points.x.length > HELD_POINTS_CAP)) {
        busy.current = false;
        await loadWhole();
      }
    } catch (caught) {
      setError(errorMessage(caught));
    } finally {
      busy.current = false;
    }
  }, [slug, run.name, job.name, loadWhole]);

  useInterval(() => void poll(), active ? POLL_MS : null);
  // The job just ended: its last frame is read once more.
  const wasActive = useRef(active);
  useEffect(() => {
    if (wasActive.current && !active) void poll();
    wasActive.current = active;
  }, [active, poll]);

  // A zoomed-in range is read again at the finer resolution the server has for it.
  useEffect(() => {
    if (!zoom || !held) {
      setDetail(null);
      return undefined;
    }
    let current = true;
    const names = [...held.series.values()].filter((s) => s.x === "time").map((s) => s.name);
    if (!names.length) return undefined;
    jobSeries(slug, run.name, { job: job.name, names, since: Math.floor(zoom[0]), until: Math.ceil(zoom[1]), points: OVERVIEW_POINTS })
      .then((answer) => current && setDetail(new Map(answer.series.map((s) => [s.name, s]))))
      .catch((caught) => current && setError(errorMessage(caught)));
    return () => {
      current = false;
    };
    // Read again for a new zoom only, not for each live update.
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [zoom?.[0], zoom?.[1], slug, run.name, job.name]);

  // The summary's names and the series held: a name the summary lists before its first points are read, or the reverse.
  const specs = useMemo(() => {
    const training = new Set(summary?.training ?? []);
    const system = new Set(summary?.system ?? []);
    for (const s of held?.series.values() ?? []) (s.kind === "training" ? training : system).add(s.name);
    return chartSpecs([...training], [...system]);
  }, [summary?.training, summary?.system, held]);
  const shown = useMemo(() => {
    if (!held) return null;
    if (!zoom || !detail) return held.series;
    const spliced = new Map(held.series);
    for (const [name, s] of held.series) spliced.set(name, spliceDetail(s, detail.get(name), zoom[0], zoom[1]));
    return spliced;
  }, [held, detail, zoom]);
  const attempts = held?.attempts ?? summary?.attempts ?? [];
  const whole = useMemo(() => (shown ? wholeRange(shown, attempts, active) : null), [shown, attempts, active]);

  if (error && !held) return <ErrorBanner error={error} />;
  if (!held || !shown) return <Loading label="Loading metrics…" />;
  if (!specs.length && summaryLoaded) {
    return <p className="muted">{active ? `No metrics from ${job.name} yet: they appear once it runs.` : `No metrics were recorded for ${job.name}.`}</p>;
  }

  const training = specs.filter((s) => s.kind === "training");
  const system = specs.filter((s) => s.kind === "system");
  const newest = newestTime(held.series.values());
  return (
    <>
      <div className="metrics-toolbar">
        <div className="metrics-zoom" role="group" aria-label="Time range">
          {QUICK_RANGES.map((r) => (
            <button
              key={r.label}
              type="button"
              className="btn btn-small"
              disabled={newest === null}
              onClick={() => newest !== null && setZoom([Math.max(whole?.[0] ?? 0, newest - r.seconds), newest])}
            >
              Last {r.label}
            </button>
          ))}
          <button type="button" className={`btn btn-small ${zoom ? "btn-active" : ""}`} disabled={!zoom} onClick={() => setZoom(null)}>
            Whole run
          </button>
        </div>
        <span className="toolbar-spacer" />
        <span className="metrics-live small muted">
          {active ? <span className="live-dot" aria-hidden="true" /> : null}
          {active ? "Live" : "Final"}
          {updatedAt ? ` · read ${clockTime(new Date(updatedAt).toISOString())}` : null}
        </span>
      </div>
      <AttemptStrip attempts={attempts} />
      <ErrorBanner error={error} />
      {summary ? <Counters summary={summary} /> : null}
      <section aria-labelledby="metrics-training" className="metrics-section">
        <h3 id="metrics-training">Training</h3>
        {training.length ? (
          <div className="metrics-grid">
            {training.map((spec, i) => (
              <TrainingChart key={spec.id} spec={spec} index={i} series={shown.get(spec.names[0])} attempts={attempts} zoom={zoom ?? whole} onZoom={setZoom} />
            ))}
          </div>
        ) : (
          <p className="muted small">
            No training metrics. Declare <code>metrics:</code> patterns for the workflow's log lines, or have the job append JSON lines such as{" "}
            <code>{'{"step": 100, "loss": 0.31}'}</code> to <code>$TRAINYARD_METRICS_FILE</code> (docs/METRICS.md).
          </p>
        )}
      </section>
      <section aria-labelledby="metrics-system" className="metrics-section">
        <h3 id="metrics-system">System</h3>
        {system.length ? (
          <div className="metrics-grid">
            {system.map((spec) => (
              <SystemChart key={spec.id} spec={spec} series={shown} attempts={attempts} range={zoom ?? whole} onZoom={setZoom} />
            ))}
          </div>
        ) : (
          <p className="muted small">No system samples yet.</p>
        )}
      </section>
    </>
  );
}

/** The x range of the whole run: its first attempt's start (or first point) to its end (or newest point). */
function wholeRange(series: Map<string, Series>, attempts: MetricAttempt[], active: boolean): [number, number] | null {
  let low = Infinity;
  let high = -Infinity;
  for (const s of series.values()) {
    if (s.x !== "time" || !s.points.x.length) continue;
    low = Math.min(low, s.points.x[0]);
    high = Math.max(high, s.points.x[s.points.x.length - 1]);
  }
  for (const a of attempts) {
    if (a.started_at) low = Math.min(low, Date.parse(a.started_at) / 1000);
    if (a.finished_at && !active) high = Math.max(high, Date.parse(a.finished_at) / 1000);
  }
  if (!Number.isFinite(low) || !Number.isFinite(high) || high <= low) return null;
  return [low, high];
}

function TrainingChart({
  spec,
  index,
  series,
  attempts,
  zoom,
  onZoom,
}: {
  spec: ChartSpec;
  index: number;
  series: Series | undefined;
  attempts: MetricAttempt[];
  zoom: [number, number] | null;
  onZoom: (range: [number, number] | null) => void;
}) {
  const color = colorAt(index);
  const shaped = useMemo(() => {
    if (!series) return null;
    if (series.x === "step") {
      const aligned = alignSteps(series);
      const lines: ChartLine[] = aligned.attempts.map((n) => ({ label: aligned.attempts.length > 1 ? `attempt ${n}` : spec.title, color }));
      return { data: aligned, lines, marks: stepMarks(attempts, series) };
    }
    return { data: alignTime([series]), lines: [{ label: spec.title, color }], marks: timeMarks(attempts) };
  }, [series, attempts, spec.title, color]);
  if (!series || !shaped) return null;
  const byStep = series.x === "step";
  return (
    <MetricChart
      title={spec.title}
      unit={series.unit}
      xKind={byStep ? "step" : "time"}
      lines={shaped.lines}
      data={shaped.data}
      marks={shaped.marks}
      xRange={byStep ? null : zoom}
      onZoom={byStep ? undefined : onZoom}
      syncKey={byStep ? undefined : "metrics-time"}
    />
  );
}

function SystemChart({
  spec,
  series,
  attempts,
  range,
  onZoom,
}: {
  spec: ChartSpec;
  series: Map<string, Series>;
  attempts: MetricAttempt[];
  range: [number, number] | null;
  onZoom: (range: [number, number] | null) => void;
}) {
  const shaped = useMemo(() => {
    const drawn = spec.names.map((n) => series.get(n)).filter((s): s is Series => s !== undefined);
    if (!drawn.length) return null;
    const band = drawn.length === 1 && Boolean(drawn[0].points.min && drawn[0].points.max) && drawn[0].resolution !== "raw";
    const lines: ChartLine[] = drawn.map((s, i) => ({ label: spec.labels[s.name] ?? s.name, color: drawn.length === 1 ? "#5b5bd6" : colorAt(i) }));
    let ceiling: number | null = null;
    for (const name of spec.ceilings) {
      const ys = series.get(name)?.points.y ?? [];
      if (ys.length) ceiling = Math.max(ceiling ?? 0, ys[ys.length - 1]);
    }
    return { data: alignTime(drawn, band), band, lines, unit: drawn[0].unit, ceiling, resolution: drawn[0].resolution };
  }, [spec, series]);
  const marks = useMemo(() => timeMarks(attempts), [attempts]);
  if (!shaped) return null;
  return (
    <MetricChart
      title={spec.title}
      unit={shaped.unit}
      xKind="time"
      lines={shaped.lines}
      data={shaped.data}
      band={shaped.band}
      marks={marks}
      yCeiling={shaped.ceiling}
      xRange={range}
      onZoom={onZoom}
      syncKey="metrics-time"
    >
      {shaped.resolution && shaped.resolution !== "raw" ? (
        <p className="metric-chart-note small muted">
          {shaped.resolution === "1m" ? "per-minute mean" : `mean per ${shaped.resolution}`}
          {shaped.band ? " (band: min to max)" : ""}; drag to zoom in
        </p>
      ) : null}
    </MetricChart>
  );
}

/** The job's attempts as chips: when each ran and why it ended (an interruption in red). */
function AttemptStrip({ attempts }: { attempts: MetricAttempt[] }) {
  if (!attempts.length) return null;
  const sorted = [...attempts].sort((a, b) => a.number - b.number);
  return (
    <ol className="attempt-strip" aria-label="Attempts">
      {sorted.map((a) => {
        const interrupted = isInterruption(a.termination_reason);
        const ended = a.finished_at ? (a.termination_reason ? reasonLabel(a.termination_reason) : "ended") : a.started_at ? "running" : "waiting";
        return (
          <li key={a.number} className={`attempt-chip ${interrupted ? "attempt-chip-interrupted" : ""}`} title={reasonDescription(a.termination_reason)}>
            <span className="attempt-chip-number">Attempt {a.number}</span>{" "}
            <span className="muted">
              {span(a.started_at, a.finished_at)}
            </span>{" "}
            <span className="attempt-chip-outcome">{ended}</span>
          </li>
        );
      })}
    </ol>
  );
}

/** "14:03:11 – 14:20:40" within today; "Nov 28 14:03 – Dec 5 09:12" when either end is another day. */
function span(started: string | null, finished: string | null): string {
  if (!started) return "—";
  const today = new Date().toDateString();
  const dated = [started, finished].some((iso) => iso !== null && new Date(iso).toDateString() !== today);
  const when = (iso: string) =>
    dated ? `${new Date(iso).toLocaleDateString("en-US", { month: "short", day: "numeric" })} ${clockTime(iso).slice(0, 5)}` : clockTime(iso);
  return finished ? `${when(started)} – ${when(finished)}` : when(started);
}

/** What the runner could not keep: values over the per-minute cap, lines of the metrics file that were not JSON. */
function Counters({ summary }: { summary: JobMetrics }) {
  const frames = summary.frames_dropped;
  if (!summary.dropped && !summary.malformed && !frames) return null;
  return (
    <div className="banner banner-warning" role="status">
      {summary.dropped ? (
        <span>
          {summary.dropped.toLocaleString("en-US")} training value{summary.dropped === 1 ? " was" : "s were"} over the job's per-minute cap and dropped
          (raise <code>metrics.per_minute</code> in the workflow, or report less often).
        </span>
      ) : null}
      {summary.malformed ? (
        <span>
          {summary.malformed.toLocaleString("en-US")} line{summary.malformed === 1 ? "" : "s"} of <code>$TRAINYARD_METRICS_FILE</code>{" "}
          {summary.malformed === 1 ? "was" : "were"} not a JSON object of numbers and {summary.malformed === 1 ? "was" : "were"} skipped.
        </span>
      ) : null}
      {frames ? (
        <span>
          {frames.toLocaleString("en-US")} metrics frame{frames === 1 ? "" : "s"} from the runner came faster than the server takes them and{" "}
          {frames === 1 ? "was" : "were"} dropped.
        </span>
      ) : null}
    </div>
  );
}
