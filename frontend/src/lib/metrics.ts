// A job's metric series shaped for its charts: which names share a chart,
// new points merged into what the page holds, points of several series
// aligned on one x axis (uPlot's data shape), and the marks of attempt
// boundaries. Pure functions: the Metrics tab and the compare page draw what
// these return.
import type { CompareSeries, ComparedRun, MetricAttempt, Series, SeriesPoints } from "../api/metrics";
import { humanBytes } from "./format";
import { reasonLabel } from "./attempts";

/** A chart of the Metrics tab: its title and the series names it draws, in order. */
export interface ChartSpec {
  id: string;
  title: string;
  kind: "training" | "system";
  names: string[];
  /** A line's label in the legend, by name ("GPU 0" for gpu0.util). */
  labels: Record<string, string>;
  /** Names whose newest value is the chart's y ceiling (GPU memory and disk totals), not drawn. */
  ceilings: string[];
}

const GPU_NAME = /^gpu(\d+)\.([a-z_]+)$/;

/** The system charts, in reading order; GPU metrics overlay every GPU in one chart. */
const SYSTEM_CHARTS: { id: string; title: string; match: (name: string) => boolean; ceiling?: (name: string) => boolean }[] = [
  { id: "cpu", title: "CPU (% of one core)", match: (n) => n === "cpu" },
  { id: "memory", title: "Memory (resident)", match: (n) => n === "memory" },
  { id: "gpu-util", title: "GPU utilisation", match: (n) => gpuMetric(n) === "util" },
  { id: "gpu-memory", title: "GPU memory", match: (n) => gpuMetric(n) === "memory", ceiling: (n) => gpuMetric(n) === "memory_total" },
  { id: "gpu-power", title: "GPU power", match: (n) => gpuMetric(n) === "power" },
  { id: "gpu-temperature", title: "GPU temperature", match: (n) => gpuMetric(n) === "temperature" },
  { id: "disk", title: "Disk (working directory)", match: (n) => n === "disk_used", ceiling: (n) => n === "disk_total" },
  { id: "network", title: "Network (machine)", match: (n) => n === "net_rx" || n === "net_tx" },
];

const SYSTEM_LABELS: Record<string, string> = {
  cpu: "CPU",
  memory: "RSS",
  disk_used: "used",
  disk_total: "total",
  net_rx: "received",
  net_tx: "sent",
};

function gpuMetric(name: string): string | null {
  const match = GPU_NAME.exec(name);
  return match ? match[2] : null;
}

function gpuIndex(name: string): number {
  const match = GPU_NAME.exec(name);
  return match ? Number(match[1]) : -1;
}

/** Training metrics first (one chart each, in the job's order), then the system charts that have series. */
export function chartSpecs(training: readonly string[], system: readonly string[]): ChartSpec[] {
  const specs: ChartSpec[] = training.map((name) => ({
    id: `training-${name}`,
    title: name,
    kind: "training",
    names: [name],
    labels: { [name]: name },
    ceilings: [],
  }));
  const byGpu = (a: string, b: string) => gpuIndex(a) - gpuIndex(b) || a.localeCompare(b);
  for (const chart of SYSTEM_CHARTS) {
    const names = system.filter(chart.match).sort(byGpu);
    if (!names.length) continue;
    const labels: Record<string, string> = {};
    for (const name of names) labels[name] = gpuIndex(name) >= 0 ? `GPU ${gpuIndex(name)}` : (SYSTEM_LABELS[name] ?? name);
    specs.push({
      id: chart.id,
      title: chart.title,
      kind: "system",
      names,
      labels,
      ceilings: chart.ceiling ? system.filter(chart.ceiling).sort(byGpu) : [],
    });
  }
  return specs;
}

/** "87.5 %", "1.2 GB", "3.4 MB/s", "212 W", "71 °C", or the number with the series' unit. */
export function formatValue(value: number | null | undefined, unit: string): string {
  if (value === null || value === undefined || Number.isNaN(value)) return "—";
  switch (unit) {
    case "B":
    case "bytes":
      return humanBytes(value);
    case "B/s":
    case "bytes/s":
      return `${humanBytes(value)}/s`;
    case "%":
      return `${value >= 100 || Number.isInteger(value) ? value.toFixed(0) : value.toFixed(1)} %`;
    default:
      return unit ? `${trimmed(value)} ${unit}` : trimmed(value);
  }
}

/** A number in at most 4 significant digits (0.3142, 12.35, 1235, 1.2e-5). */
export function trimmed(value: number, digits?: number): string {
  if (digits !== undefined) return value.toFixed(digits);
  const abs = Math.abs(value);
  if (abs !== 0 && (abs < 1e-3 || abs >= 1e7)) return value.toExponential(2);
  if (Number.isInteger(value)) return String(value);
  return String(Number(value.toPrecision(4)));
}

// --- merging ------------------------------------------------------------------

function column(points: SeriesPoints, key: "min" | "max"): number[] | undefined {
  return points[key];
}

function take(points: SeriesPoints, indexes: number[]): SeriesPoints {
  const out: SeriesPoints = { x: [], y: [], attempt: [] };
  const min = column(points, "min");
  const max = column(points, "max");
  if (min) out.min = [];
  if (max) out.max = [];
  for (const i of indexes) {
    out.x.push(points.x[i]);
    out.y.push(points.y[i]);
    out.attempt.push(points.attempt[i]);
    if (min && out.min) out.min.push(min[i]);
    if (max && out.max) out.max.push(max[i]);
  }
  return out;
}

function concat(a: SeriesPoints, b: SeriesPoints): SeriesPoints {
  const out: SeriesPoints = { x: a.x.concat(b.x), y: a.y.concat(b.y), attempt: a.attempt.concat(b.attempt) };
  if (a.min || b.min) out.min = (a.min ?? a.y).concat(b.min ?? b.y);
  if (a.max || b.max) out.max = (a.max ?? a.y).concat(b.max ?? b.y);
  return out;
}

function range(n: number): number[] {
  return Array.from({ length: n }, (_, i) => i);
}

/**
 * `fresh` (an answer for `since`) merged into `held`: a time series keeps its
 * points before fresh's first one and takes fresh's from there; a step series
 * keeps one value per (attempt, step), fresh's winning, ordered by attempt then step.
 */
export function mergeSeries(held: Series | undefined, fresh: Series): Series {
  if (!held || held.x !== fresh.x) return fresh;
  if (!fresh.points.x.length) return held;
  if (fresh.x === "time") {
    const first = fresh.points.x[0];
    const kept = range(held.points.x.length).filter((i) => held.points.x[i] < first);
    return { ...held, points: concat(take(held.points, kept), fresh.points) };
  }
  const key = (attempt: number, step: number) => `${attempt}:${step}`;
  const fresher = new Set(fresh.points.x.map((x, i) => key(fresh.points.attempt[i], x)));
  const kept = range(held.points.x.length).filter((i) => !fresher.has(key(held.points.attempt[i], held.points.x[i])));
  const joined = concat(take(held.points, kept), fresh.points);
  const order = range(joined.x.length).sort((a, b) => joined.attempt[a] - joined.attempt[b] || joined.x[a] - joined.x[b]);
  return { ...held, points: take(joined, order) };
}

/** A time series' overview with the finer points of [since, until] in their place (a zoomed-in range). */
export function spliceDetail(overview: Series, detail: Series | undefined, since: number, until: number): Series {
  if (!detail || overview.x !== "time" || detail.x !== "time") return overview;
  const p = overview.points;
  const before = range(p.x.length).filter((i) => p.x[i] < since);
  const after = range(p.x.length).filter((i) => p.x[i] > until);
  const inside = range(detail.points.x.length).filter((i) => detail.points.x[i] >= since && detail.points.x[i] <= until);
  return {
    ...overview,
    resolution: detail.resolution,
    points: concat(concat(take(p, before), take(detail.points, inside)), take(p, after)),
  };
}

/** The newest x of the job's time-keyed series (unix s), or null: where the next `since` starts. */
export function newestTime(series: Iterable<Series>): number | null {
  let newest: number | null = null;
  for (const s of series) {
    if (s.x !== "time" || !s.points.x.length) continue;
    const last = s.points.x[s.points.x.length - 1];
    if (newest === null || last > newest) newest = last;
  }
  return newest;
}

// --- aligning -----------------------------------------------------------------

/** uPlot's data: one x column, one y column per line (null: no point there). */
export interface Aligned {
  x: number[];
  ys: (number | null)[][];
}

/**
 * Time series aligned on the union of their x (unix s). Where consecutive
 * points belong to different attempts a null row is put between them, so a
 * line breaks at an attempt boundary instead of bridging the interruption.
 * `withBand`: also the first series' min and max columns (after the lines).
 */
export function alignTime(series: readonly Series[], withBand = false): Aligned {
  const xs = new Set<number>();
  const attemptAt = new Map<number, number>();
  for (const s of series) {
    s.points.x.forEach((x, i) => {
      xs.add(x);
      if (!attemptAt.has(x)) attemptAt.set(x, s.points.attempt[i]);
    });
  }
  const sorted = [...xs].sort((a, b) => a - b);
  const x: number[] = [];
  for (let i = 0; i < sorted.length; i += 1) {
    if (i > 0 && attemptAt.get(sorted[i]) !== attemptAt.get(sorted[i - 1])) x.push((sorted[i] + sorted[i - 1]) / 2);
    x.push(sorted[i]);
  }
  const index = new Map<number, number>();
  x.forEach((value, i) => index.set(value, i));
  const columnOf = (s: Series, values: number[]) => {
    const out: (number | null)[] = new Array(x.length).fill(null);
    s.points.x.forEach((value, i) => {
      out[index.get(value) as number] = values[i];
    });
    return out;
  };
  const ys = series.map((s) => columnOf(s, s.points.y));
  if (withBand && series.length && series[0].points.min && series[0].points.max) {
    ys.push(columnOf(series[0], series[0].points.min), columnOf(series[0], series[0].points.max));
  }
  return { x, ys };
}

/**
 * A step series as one line per attempt on the union of its steps: a resumed
 * attempt that repeats steps since its checkpoint is drawn over them as its
 * own line, never folded into the interrupted one. `attempts` names the lines.
 */
export function alignSteps(series: Series): Aligned & { attempts: number[] } {
  const attempts = [...new Set(series.points.attempt)].sort((a, b) => a - b);
  const x = [...new Set(series.points.x)].sort((a, b) => a - b);
  const index = new Map<number, number>();
  x.forEach((value, i) => index.set(value, i));
  const ys = attempts.map(() => new Array<number | null>(x.length).fill(null));
  series.points.x.forEach((step, i) => {
    ys[attempts.indexOf(series.points.attempt[i])][index.get(step) as number] = series.points.y[i];
  });
  return { x, ys, attempts };
}

// --- attempt boundaries ------------------------------------------------------------

/** A boundary on a chart: a line at `x` with its label; `until` makes it a band (the time a job was away). */
export interface Mark {
  x: number;
  until?: number;
  label: string;
  /** The attempt before it ended abnormally (spot reclaim, lost machine, a guard…): drawn in red. */
  interrupted: boolean;
  /** A step chart: the last point of the interrupted attempt, marked with a cross. */
  cut?: { x: number; y: number };
}

/** Reasons an attempt ends that are no interruption. */
const ORDINARY_ENDINGS = new Set(["", "done", "error", "stopped_by_user"]);

export function isInterruption(reason: string): boolean {
  return !ORDINARY_ENDINGS.has(reason);
}

function unix(iso: string | null): number | null {
  return iso ? new Date(iso).getTime() / 1000 : null;
}

function sortedAttempts(attempts: readonly MetricAttempt[]): MetricAttempt[] {
  return [...attempts].sort((a, b) => a.number - b.number);
}

/**
 * The marks of a time chart: each attempt after the first starts at a line
 * ("attempt 2"); when the one before it was interrupted, the time between
 * them is a red band named for the reason. A last attempt that ended
 * abnormally gets a red line where it ended.
 */
export function timeMarks(attempts: readonly MetricAttempt[]): Mark[] {
  const sorted = sortedAttempts(attempts);
  const marks: Mark[] = [];
  sorted.forEach((attempt, i) => {
    const previous = sorted[i - 1];
    const started = unix(attempt.started_at);
    if (previous && started !== null) {
      const interrupted = isInterruption(previous.termination_reason);
      const ended = unix(previous.finished_at);
      marks.push({
        x: interrupted && ended !== null && ended < started ? ended : started,
        until: interrupted && ended !== null && ended < started ? started : undefined,
        label: interrupted ? `${reasonLabel(previous.termination_reason)} → attempt ${attempt.number}` : `attempt ${attempt.number}`,
        interrupted,
      });
    }
    const ended = unix(attempt.finished_at);
    if (!sorted[i + 1] && ended !== null && isInterruption(attempt.termination_reason)) {
      marks.push({ x: ended, label: `attempt ${attempt.number}: ${reasonLabel(attempt.termination_reason)}`, interrupted: true });
    }
  });
  return marks;
}

/**
 * The marks of a step chart: a line at each later attempt's first step
 * (red, named for the reason, when the attempt before it was interrupted,
 * with a cross on the interrupted attempt's last point).
 */
export function stepMarks(attempts: readonly MetricAttempt[], series: Series): Mark[] {
  const sorted = sortedAttempts(attempts);
  const marks: Mark[] = [];
  const points = series.points;
  sorted.forEach((attempt, i) => {
    const previous = sorted[i - 1];
    if (!previous) return;
    const mine = range(points.x.length).filter((k) => points.attempt[k] === attempt.number);
    if (!mine.length) return;
    const first = Math.min(...mine.map((k) => points.x[k]));
    const interrupted = isInterruption(previous.termination_reason);
    const before = range(points.x.length).filter((k) => points.attempt[k] === previous.number);
    const lastOfPrevious = before.length ? before.reduce((a, b) => (points.x[b] > points.x[a] ? b : a)) : null;
    marks.push({
      x: first,
      label: interrupted ? `${reasonLabel(previous.termination_reason)} → attempt ${attempt.number}` : `attempt ${attempt.number}`,
      interrupted,
      cut: interrupted && lastOfPrevious !== null ? { x: points.x[lastOfPrevious], y: points.y[lastOfPrevious] } : undefined,
    });
  });
  return marks;
}

// --- compare ------------------------------------------------------------------------

/** The (name, x kind) pairs the compared runs have series for, training names first as the runs list them. */
export function comparedNames(runs: readonly ComparedRun[]): { name: string; x: "step" | "time" }[] {
  const seen = new Map<string, { name: string; x: "step" | "time" }>();
  for (const run of runs) for (const s of run.series) if (!seen.has(`${s.name}|${s.x}`)) seen.set(`${s.name}|${s.x}`, { name: s.name, x: s.x });
  return [...seen.values()];
}

/** One line per run and job: a resumed attempt's value wins at a step both attempts reached; time is seconds since the run's first point. */
export interface CompareLine {
  run: string;
  job: string;
  x: number[];
  y: number[];
}

export function compareLines(runs: readonly ComparedRun[], name: string, kind: "step" | "time"): CompareLine[] {
  const lines: CompareLine[] = [];
  for (const run of runs) {
    for (const s of run.series.filter((c: CompareSeries) => c.name === name && c.x === kind)) {
      const byX = new Map<number, { y: number; attempt: number }>();
      const origin = s.points.x.length ? Math.min(...s.points.x) : 0;
      s.points.x.forEach((x, i) => {
        const key = kind === "time" ? x - origin : x;
        const held = byX.get(key);
        if (!held || s.points.attempt[i] >= held.attempt) byX.set(key, { y: s.points.y[i], attempt: s.points.attempt[i] });
      });
      const xs = [...byX.keys()].sort((a, b) => a - b);
      lines.push({ run: run.run, job: s.job, x: xs, y: xs.map((x) => (byX.get(x) as { y: number }).y) });
    }
  }
  return lines;
}

/** Lines of different x aligned on the union of their x (null where a line has no point). */
export function alignLines(lines: readonly CompareLine[]): Aligned {
  const x = [...new Set(lines.flatMap((l) => l.x))].sort((a, b) => a - b);
  const index = new Map<number, number>();
  x.forEach((value, i) => index.set(value, i));
  const ys = lines.map((line) => {
    const out = new Array<number | null>(x.length).fill(null);
    line.x.forEach((value, i) => {
      out[index.get(value) as number] = line.y[i];
    });
    return out;
  });
  return { x, ys };
}

// --- colours ----------------------------------------------------------------------

/** Line colours (Tableau 10): told apart on white, GPUs and compared runs alike. */
export const PALETTE = ["#4e79a7", "#f28e2b", "#e15759", "#59a14f", "#b07aa1", "#76b7b2", "#edc948", "#9c755f", "#ff9da7", "#bab0ac"];

export function colorAt(i: number): string {
  return PALETTE[i % PALETTE.length];
}
