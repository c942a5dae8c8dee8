import { describe, expect, it } from "vitest";
import type { ComparedRun, MetricAttempt, Series } from "../api/metrics";
import {
  alignLines,
  alignSteps,
  alignTime,
  chartSpecs,
  compareLines,
  comparedNames,
  formatValue,
  mergeSeries,
  newestTime,
  spliceDetail,
  stepMarks,
  timeMarks,
} from "../lib/metrics";

const T0 = 1_760_000_000;
const iso = (unix: number) => new Date(unix * 1000).toISOString();

function timeSeries(name: string, x: number[], y: number[], attempt: number[], extra: Partial<Series> = {}): Series {
  return { name, kind: "system", x: "time", unit: "%", resolution: "raw", points: { x, y, attempt }, ...extra };
}

function stepSeries(name: string, x: number[], y: number[], attempt: number[]): Series {
  return { name, kind: "training", x: "step", unit: "", points: { x, y, attempt } };
}

const INTERRUPTED: MetricAttempt[] = [
  { number: 1, started_at: iso(T0), finished_at: iso(T0 + 100), termination_reason: "interrupted" },
  { number: 2, started_at: iso(T0 + 160), finished_at: null, termination_reason: "" },
];

describe("chartSpecs", () => {
  it("gives each training metric its chart, then CPU, memory and one chart per GPU metric over all GPUs", () => {
    const specs = chartSpecs(
      ["loss", "acc"],
      ["cpu", "memory", "gpu1.util", "gpu0.util", "gpu10.util", "gpu0.memory", "gpu0.memory_total", "gpu1.memory", "gpu1.memory_total", "net_rx", "net_tx", "disk_used", "disk_total"],
    );
    expect(specs.map((s) => s.title)).toEqual([
      "loss",
      "acc",
      "CPU (% of one core)",
      "Memory (resident)",
      "GPU utilisation",
      "GPU memory",
      "Disk (working directory)",
      "Network (machine)",
    ]);
    const util = specs.find((s) => s.id === "gpu-util");
    expect(util?.names).toEqual(["gpu0.util", "gpu1.util", "gpu10.util"]);
    expect(util?.labels["gpu10.util"]).toBe("GPU 10");
    expect(specs.find((s) => s.id === "gpu-memory")?.ceilings).toEqual(["gpu0.memory_total", "gpu1.memory_total"]);
    expect(specs.find((s) => s.id === "disk")?.ceilings).toEqual(["disk_total"]);
  });

  it("draws no GPU chart for a job without GPUs", () => {
    expect(chartSpecs([], ["cpu", "memory"]).map((s) => s.id)).toEqual(["cpu", "memory"]);
  });
});

describe("formatValue", () => {
  it("says bytes, rates, percent and plain numbers as people read them", () => {
    expect(formatValue(1536, "B")).toBe("1.5 KB");
    expect(formatValue(3 * 2 ** 20, "B/s")).toBe("3.0 MB/s");
    expect(formatValue(87.54, "%")).toBe("87.5 %");
    expect(formatValue(250, "%")).toBe("250 %");
    expect(formatValue(50, "%")).toBe("50 %");
    expect(formatValue(0.314159, "")).toBe("0.3142");
    expect(formatValue(212.4, "W")).toBe("212.4 W");
    expect(formatValue(null, "%")).toBe("—");
  });
});

describe("mergeSeries", () => {
  it("takes a time series' fresh points from the first one on, keeping older ones", () => {
    const held = timeSeries("cpu", [10, 15, 20, 25], [1, 2, 3, 4], [1, 1, 1, 1]);
    const fresh = timeSeries("cpu", [20, 25, 30], [3, 4.5, 5], [1, 1, 1]);
    const merged = mergeSeries(held, fresh);
    expect(merged.points.x).toEqual([10, 15, 20, 25, 30]);
    expect(merged.points.y).toEqual([1, 2, 3, 4.5, 5]);
  });

  it("keeps one value per attempt and step, the fresh one winning, ordered by attempt then step", () => {
    const held = stepSeries("loss", [1, 2, 3, 2], [0.9, 0.8, 0.7, 0.85], [1, 1, 1, 2]);
    const fresh = stepSeries("loss", [2, 3, 4], [0.79, 0.72, 0.6], [2, 2, 2]);
    const merged = mergeSeries(held, fresh);
    expect(merged.points.x).toEqual([1, 2, 3, 2, 3, 4]);
    expect(merged.points.attempt).toEqual([1, 1, 1, 2, 2, 2]);
    expect(merged.points.y).toEqual([0.9, 0.8, 0.7, 0.79, 0.72, 0.6]);
  });

  it("keeps what it held when nothing is new", () => {
    const held = timeSeries("cpu", [10], [1], [1]);
    expect(mergeSeries(held, timeSeries("cpu", [], [], []))).toBe(held);
  });
});

describe("spliceDetail", () => {
  it("puts the finer points of a zoomed range in place of the overview's", () => {
    const overview = timeSeries("cpu", [0, 60, 120, 180], [1, 2, 3, 4], [1, 1, 1, 1], { resolution: "1m", points: { x: [0, 60, 120, 180], y: [1, 2, 3, 4], min: [0, 1, 2, 3], max: [2, 3, 4, 5], attempt: [1, 1, 1, 1] } });
    const detail = timeSeries("cpu", [60, 65, 70, 120], [2, 2.1, 2.2, 3], [1, 1, 1, 1]);
    const spliced = spliceDetail(overview, detail, 60, 120);
    expect(spliced.points.x).toEqual([0, 60, 65, 70, 120, 180]);
    expect(spliced.points.min).toEqual([0, 2, 2.1, 2.2, 3, 3]);
    expect(spliced.resolution).toBe("raw");
  });
});

describe("alignTime", () => {
  it("aligns series on their times and breaks the line between attempts", () => {
    const a = timeSeries("gpu0.util", [T0, T0 + 5, T0 + 170], [10, 20, 30], [1, 1, 2]);
    const b = timeSeries("gpu1.util", [T0, T0 + 5, T0 + 170], [11, 21, 31], [1, 1, 2]);
    const aligned = alignTime([a, b]);
    expect(aligned.x).toEqual([T0, T0 + 5, T0 + 87.5, T0 + 170]);
    expect(aligned.ys).toEqual([
      [10, 20, null, 30],
      [11, 21, null, 31],
    ]);
  });

  it("adds the first series' min and max columns for its band", () => {
    const s = timeSeries("cpu", [0, 60], [5, 6], [1, 1], { points: { x: [0, 60], y: [5, 6], min: [1, 2], max: [9, 10], attempt: [1, 1] } });
    expect(alignTime([s], true).ys).toEqual([
      [5, 6],
      [1, 2],
      [9, 10],
    ]);
  });

  it("knows the newest time held", () => {
    expect(newestTime([timeSeries("cpu", [1, 9], [0, 0], [1, 1]), stepSeries("loss", [100], [1], [1])])).toBe(9);
    expect(newestTime([stepSeries("loss", [100], [1], [1])])).toBeNull();
  });
});

describe("alignSteps", () => {
  it("draws a resumed attempt's steps as its own line over the steps it repeats", () => {
    const s = stepSeries("loss", [1, 2, 3, 2, 3, 4], [0.9, 0.8, 0.7, 0.81, 0.71, 0.6], [1, 1, 1, 2, 2, 2]);
    const aligned = alignSteps(s);
    expect(aligned.x).toEqual([1, 2, 3, 4]);
    expect(aligned.attempts).toEqual([1, 2]);
    expect(aligned.ys).toEqual([
      [0.9, 0.8, 0.7, null],
      [null, 0.81, 0.71, 0.6],
    ]);
  });
});

describe("attempt marks", () => {
  it("marks the time a job was away after an interruption as a red band up to its next attempt", () => {
    const marks = timeMarks(INTERRUPTED);
    expect(marks).toEqual([{ x: T0 + 100, until: T0 + 160, label: "interrupted → attempt 2", interrupted: true }]);
  });

  it("marks an ordinary next attempt with a grey line, and a last attempt that a guard ended", () => {
    const marks = timeMarks([
      { number: 1, started_at: iso(T0), finished_at: iso(T0 + 10), termination_reason: "error" },
      { number: 2, started_at: iso(T0 + 20), finished_at: iso(T0 + 900), termination_reason: "stalled" },
    ]);
    expect(marks).toEqual([
      { x: T0 + 20, until: undefined, label: "attempt 2", interrupted: false },
      { x: T0 + 900, label: "attempt 2: stalled", interrupted: true },
    ]);
  });

  it("marks where a resumed attempt's steps start, with a cross on the interrupted attempt's last value", () => {
    const s = stepSeries("loss", [1, 2, 3, 2, 3], [0.9, 0.8, 0.7, 0.81, 0.71], [1, 1, 1, 2, 2]);
    expect(stepMarks(INTERRUPTED, s)).toEqual([{ x: 2, label: "interrupted → attempt 2", interrupted: true, cut: { x: 3, y: 0.7 } }]);
  });
});

describe("compare", () => {
  const run = (name: string, series: ComparedRun["series"]): ComparedRun => ({
    run: name,
    workflow: "train",
    status: "succeeded",
    commit: "a".repeat(40),
    params: {},
    cost: null,
    last: {},
    series,
  });

  it("overlays one line per run: the resumed attempt's value wins where both reached a step", () => {
    const runs = [
      run("a-1", [{ name: "loss", job: "train", x: "step", points: { x: [1, 2, 2, 3], y: [0.9, 0.8, 0.79, 0.7], attempt: [1, 1, 2, 2] } }]),
      run("b-2", [{ name: "loss", job: "train", x: "step", points: { x: [1, 3], y: [1.0, 0.5], attempt: [1, 1] } }]),
    ];
    expect(comparedNames(runs)).toEqual([{ name: "loss", x: "step" }]);
    const lines = compareLines(runs, "loss", "step");
    expect(lines.map((l) => [l.run, l.x, l.y])).toEqual([
      ["a-1", [1, 2, 3], [0.9, 0.79, 0.7]],
      ["b-2", [1, 3], [1.0, 0.5]],
    ]);
    expect(alignLines(lines)).toEqual({ x: [1, 2, 3], ys: [[0.9, 0.79, 0.7], [1.0, null, 0.5]] });
  });

  it("puts time-keyed curves on the time since each run's first value", () => {
    const runs = [run("a-1", [{ name: "reward", job: "train", x: "time", points: { x: [T0 + 50, T0 + 60], y: [1, 2], attempt: [1, 1] } }])];
    expect(compareLines(runs, "reward", "time")[0].x).toEqual([0, 10]);
  });
});
