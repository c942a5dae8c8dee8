import { act, fireEvent, render, screen, waitFor, within } from "@testing-library/react";
import { MemoryRouter } from "react-router-dom";
import { afterEach, describe, expect, it, vi } from "vitest";
import type { RunMetrics, Series, SeriesAnswer } from "../api/metrics";
import type { Job, Run } from "../api/types";
import { MetricsPanel, OVERLAP_SECONDS, POLL_MS } from "../components/MetricsPanel";
import { WorkspaceContext, workspaceState } from "../workspace";

const T0 = 1_760_000_000;
const iso = (unix: number) => new Date(unix * 1000).toISOString();

const ATTEMPTS = [
  { number: 1, started_at: iso(T0), finished_at: iso(T0 + 100), termination_reason: "interrupted" },
  { number: 2, started_at: iso(T0 + 160), finished_at: null, termination_reason: "" },
];

function job(overrides: Partial<Job> = {}): Job {
  return {
    id: "job-1",
    name: "train",
    status: "running",
    status_reason: "",
    exit_code: null,
    attempt: 2,
    attempts: [],
    instance: "local-1",
    resources: {} as Job["resources"],
    created_at: iso(T0),
    started_at: iso(T0),
    finished_at: null,
    last_seq: 10,
    ...overrides,
  };
}

function run(overrides: Partial<Run> = {}): Run {
  return {
    id: "run-1",
    name: "brave-otter-1",
    workflow: "train",
    status: "running",
    status_reason: "",
    exit_code: null,
    created_at: iso(T0),
    started_at: iso(T0),
    finished_at: null,
    duration_seconds: null,
    code: { kind: "archive" },
    jobs: [job()],
    ...overrides,
  };
}

function summary(overrides: Partial<RunMetrics["jobs"][number]> = {}): RunMetrics {
  return {
    jobs: [
      {
        job: "train",
        attempts: ATTEMPTS,
        system: ["cpu", "memory", "gpu0.util", "gpu1.util"],
        training: ["loss"],
        last: { loss: { value: 0.5, step: 3, t: iso(T0 + 175), attempt: 2 } },
        dropped: 0,
        malformed: 0,
        frames_dropped: 0,
        ...overrides,
      },
    ],
  };
}

const cpu = (x: number[], y: number[], attempt: number[]): Series => ({ name: "cpu", kind: "system", x: "time", unit: "%", resolution: "raw", points: { x, y, attempt } });
const gpu = (i: number, x: number[], y: number[], attempt: number[]): Series => ({
  name: `gpu${i}.util`,
  kind: "system",
  x: "time",
  unit: "%",
  resolution: "raw",
  points: { x, y, attempt },
});
const loss = (x: number[], y: number[], attempt: number[]): Series => ({ name: "loss", kind: "training", x: "step", unit: "", points: { x, y, attempt } });

const WHOLE: SeriesAnswer = {
  job: "train",
  attempts: ATTEMPTS,
  series: [
    loss([1, 2, 3, 2, 3], [0.9, 0.8, 0.7, 0.6, 0.5], [1, 1, 1, 2, 2]),
    cpu([T0, T0 + 5, T0 + 170, T0 + 175], [98, 99, 97, 96.5], [1, 1, 2, 2]),
    gpu(0, [T0, T0 + 5, T0 + 170, T0 + 175], [80, 81, 82, 83], [1, 1, 2, 2]),
    gpu(1, [T0, T0 + 5, T0 + 170, T0 + 175], [40, 41, 42, 43.4], [1, 1, 2, 2]),
  ],
};

type Answer = RunMetrics | SeriesAnswer | { message: string };

/** The server: the run's metrics summary, then series answers in turn (the last repeats); every URL asked is kept. */
function serve(metrics: RunMetrics, series: Answer[], status = 200) {
  const urls: string[] = [];
  let answered = 0;
  vi.stubGlobal(
    "fetch",
    vi.fn(async (url: string) => {
      urls.push(url);
      if (url.startsWith("/api/v1/workspaces/acme/runs/brave-otter-1/metrics/series/")) {
        const answer = series[Math.min(answered++, series.length - 1)];
        return new Response(JSON.stringify(answer), { status });
      }
      if (url === "/api/v1/workspaces/acme/runs/brave-otter-1/metrics/") return new Response(JSON.stringify(metrics));
      return new Response(JSON.stringify({ message: `unexpected ${url}` }), { status: 500 });
    }),
  );
  return urls;
}

function renderPanel(r: Run = run(), j: Job | null = r.jobs[0] ?? null) {
  return render(
    <WorkspaceContext.Provider value={workspaceState({ slug: "acme", name: "Acme", role: "member" }, [], async () => {})}>
      <MemoryRouter>
        <MetricsPanel run={r} job={j} />
      </MemoryRouter>
    </WorkspaceContext.Provider>,
  );
}

const chart = (name: string) => screen.getByRole("figure", { name: `${name} chart` });
const legendValue = (figure: HTMLElement, line: string) =>
  (figure.querySelector(`[data-line="${line}"] .metric-legend-value`) as HTMLElement).textContent;

afterEach(() => {
  vi.useRealTimers();
  vi.unstubAllGlobals();
});

describe("MetricsPanel", () => {
  it("draws a chart per training metric and per system metric, GPUs overlaid, with the attempts and their interruption", async () => {
    const urls = serve(summary(), [WHOLE]);
    renderPanel();
    await screen.findByRole("figure", { name: "loss chart" });
    expect(urls).toContain("/api/v1/workspaces/acme/runs/brave-otter-1/metrics/series/?job=train&points=1000");

    const lossChart = chart("loss");
    // One line per attempt on the shared steps: the resumed attempt repeats step 2 and 3.
    expect(legendValue(lossChart, "attempt 1")).toBe("0.7");
    expect(legendValue(lossChart, "attempt 2")).toBe("0.5");
    expect(lossChart).toHaveAttribute("data-points", "5");

    const util = chart("GPU utilisation");
    expect(legendValue(util, "GPU 0")).toBe("83 %");
    expect(legendValue(util, "GPU 1")).toBe("43.4 %");
    expect(legendValue(chart("CPU (% of one core)"), "CPU")).toBe("96.5 %");
    expect(screen.queryByRole("figure", { name: "GPU memory chart" })).toBeNull();

    const strip = screen.getByRole("list", { name: "Attempts" });
    const [first, second] = within(strip).getAllByRole("listitem");
    expect(first).toHaveTextContent("Attempt 1");
    expect(first).toHaveTextContent("interrupted");
    expect(first).toHaveClass("attempt-chip-interrupted");
    expect(second).toHaveTextContent("running");
    expect(screen.getByText(/Live/)).toBeInTheDocument();
  });

  it("reads the points since the newest one every few seconds while the job runs, and new points appear", async () => {
    vi.useFakeTimers({ shouldAdvanceTime: true });
    const fresh: SeriesAnswer = {
      job: "train",
      attempts: ATTEMPTS,
      series: [
        loss([3, 4], [0.5, 0.42], [2, 2]),
        cpu([T0 + 175, T0 + 180], [96.5, 91], [2, 2]),
        gpu(0, [T0 + 175, T0 + 180], [83, 90], [2, 2]),
        gpu(1, [T0 + 175, T0 + 180], [43.4, 44], [2, 2]),
      ],
    };
    const urls = serve(summary(), [WHOLE, fresh]);
    renderPanel();
    await screen.findByRole("figure", { name: "loss chart" });
    expect(chart("loss")).toHaveAttribute("data-points", "5");

    await act(() => vi.advanceTimersByTimeAsync(POLL_MS + 10));
    await waitFor(() => expect(chart("loss")).toHaveAttribute("data-points", "6"));
    const since = T0 + 175 - OVERLAP_SECONDS;
    expect(urls).toContain(`/api/v1/workspaces/acme/runs/brave-otter-1/metrics/series/?job=train&since=${since}&points=1000`);
    expect(legendValue(chart("loss"), "attempt 2")).toBe("0.42");
    expect(legendValue(chart("GPU utilisation"), "GPU 0")).toBe("90 %");
    expect(chart("CPU (% of one core)")).toHaveAttribute("data-last-x", String(T0 + 180));
  });

  it("reads a series that appears while the job runs whole", async () => {
    vi.useFakeTimers({ shouldAdvanceTime: true });
    const accuracy: Series = { name: "acc", kind: "training", x: "step", unit: "", points: { x: [1, 2, 3], y: [0.5, 0.6, 0.7], attempt: [2, 2, 2] } };
    const urls = serve(summary({ training: ["loss", "acc"] }), [WHOLE, { job: "train", attempts: ATTEMPTS, series: [{ ...accuracy, points: { x: [3], y: [0.7], attempt: [2] } }] }, { job: "train", attempts: ATTEMPTS, series: [accuracy] }]);
    renderPanel();
    await screen.findByRole("figure", { name: "loss chart" });
    await act(() => vi.advanceTimersByTimeAsync(POLL_MS + 10));
    await waitFor(() => expect(chart("acc")).toHaveAttribute("data-points", "3"));
    expect(urls).toContain("/api/v1/workspaces/acme/runs/brave-otter-1/metrics/series/?job=train&names=acc&points=1000");
  });

  it("reads nothing more once the job has ended", async () => {
    vi.useFakeTimers({ shouldAdvanceTime: true });
    const ended = job({ status: "succeeded", finished_at: iso(T0 + 200) });
    const urls = serve(summary(), [WHOLE]);
    renderPanel(run({ status: "succeeded", jobs: [ended] }), ended);
    await screen.findByRole("figure", { name: "loss chart" });
    const asked = urls.length;
    await act(() => vi.advanceTimersByTimeAsync(POLL_MS * 3));
    expect(urls).toHaveLength(asked);
    expect(screen.getByText(/Final/)).toBeInTheDocument();
  });

  it("shows a zoomed range read again at finer resolution, and goes back to the whole run", async () => {
    const urls = serve(summary(), [WHOLE]);
    renderPanel();
    await screen.findByRole("figure", { name: "loss chart" });
    const whole = screen.getByRole("button", { name: "Whole run" });
    expect(whole).toBeDisabled();
    fireEvent.click(screen.getByRole("button", { name: "Last 15 min" }));
    await waitFor(() =>
      expect(urls).toContain(
        `/api/v1/workspaces/acme/runs/brave-otter-1/metrics/series/?job=train&names=cpu%2Cgpu0.util%2Cgpu1.util&since=${T0}&until=${T0 + 175}&points=1000`,
      ),
    );
    expect(whole).toBeEnabled();
    fireEvent.click(whole);
    expect(whole).toBeDisabled();
  });

  it("says how many training values were over the cap and how many metrics-file lines were skipped", async () => {
    serve(summary({ dropped: 1200, malformed: 1, frames_dropped: 3 }), [WHOLE]);
    renderPanel();
    const banner = await screen.findByText(/over the job's per-minute cap/);
    expect(banner).toHaveTextContent("1,200 training values were over the job's per-minute cap and dropped");
    expect(screen.getByText(/was not a JSON object of numbers/)).toHaveTextContent("1 line of $TRAINYARD_METRICS_FILE was not a JSON object of numbers and was skipped.");
    expect(screen.getByText(/came faster than the server/)).toHaveTextContent("3 metrics frames from the runner came faster than the server takes them and were dropped.");
  });

  it("says how to report training metrics when the job has none, and that a job without samples has none yet", async () => {
    serve(summary({ training: [], system: ["cpu"] }), [{ job: "train", attempts: ATTEMPTS, series: [WHOLE.series[1]] }]);
    renderPanel();
    expect(await screen.findByText(/No training metrics/)).toHaveTextContent("$TRAINYARD_METRICS_FILE");
    expect(chart("CPU (% of one core)")).toBeInTheDocument();
  });

  it("says a job has no metrics yet when the summary does not list it", async () => {
    serve({ jobs: [] }, [{ job: "train", attempts: [], series: [] }]);
    renderPanel();
    expect(await screen.findByText("No metrics from train yet: they appear once it runs.")).toBeInTheDocument();
  });

  it("shows the server's message when the series cannot be read", async () => {
    serve(summary(), [{ message: "This run has no job named train." }], 404);
    renderPanel();
    expect(await screen.findByRole("alert")).toHaveTextContent("This run has no job named train.");
  });
});
