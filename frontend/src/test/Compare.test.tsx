import { fireEvent, render, screen, within } from "@testing-library/react";
import { MemoryRouter, Route, Routes, useLocation } from "react-router-dom";
import { afterEach, describe, expect, it, vi } from "vitest";
import { SocketFactoryContext, type SocketLike } from "../api/live";
import type { CompareAnswer, ComparedRun } from "../api/metrics";
import type { Run } from "../api/types";
import { ComparePage } from "../pages/Compare";
import { RunsPage } from "../pages/Runs";
import { WorkspaceContext, workspaceState } from "../workspace";

function makeRun(name: string, workflow: string): Run {
  return {
    id: `id-${name}`,
    name,
    workflow,
    status: "succeeded",
    status_reason: "",
    exit_code: 0,
    created_at: new Date().toISOString(),
    started_at: new Date().toISOString(),
    finished_at: new Date().toISOString(),
    duration_seconds: 60,
    code: { kind: "archive" },
    jobs: [],
  };
}

function compared(name: string, overrides: Partial<ComparedRun>): ComparedRun {
  return {
    run: name,
    workflow: "train",
    status: "succeeded",
    commit: "0123456789abcdef0123456789abcdef01234567",
    params: {},
    cost: null,
    last: {},
    series: [],
    ...overrides,
  };
}

const idle: SocketLike = { onopen: null, onmessage: null, onclose: null, onerror: null, close: () => undefined, send: () => undefined } as unknown as SocketLike;

function Where() {
  const location = useLocation();
  return <output aria-label="location">{location.pathname + location.search}</output>;
}

function renderAt(path: string, answer: (url: string) => unknown, status = 200) {
  const urls: string[] = [];
  vi.stubGlobal(
    "fetch",
    vi.fn(async (url: string) => {
      urls.push(url);
      return new Response(JSON.stringify(answer(url)), { status });
    }),
  );
  render(
    <SocketFactoryContext.Provider value={() => idle}>
      <WorkspaceContext.Provider value={workspaceState({ slug: "acme", name: "Acme", role: "viewer" }, [], async () => {})}>
        <MemoryRouter initialEntries={[path]}>
          <Routes>
            <Route path="/w/acme/runs" element={<RunsPage />} />
            <Route path="/w/acme/compare" element={<ComparePage />} />
          </Routes>
          <Where />
        </MemoryRouter>
      </WorkspaceContext.Provider>
    </SocketFactoryContext.Provider>,
  );
  return urls;
}

afterEach(() => vi.unstubAllGlobals());

describe("Compare runs", () => {
  it("picks runs of one workflow from the runs list and opens the compare page with them", async () => {
    const runs = [makeRun("lr-high-3", "train"), makeRun("eval-2", "eval"), makeRun("lr-low-1", "train")];
    const urls = renderAt("/w/acme/runs", (url) =>
      url.includes("/metrics/compare/")
        ? { runs: [compared("lr-high-3", {}), compared("lr-low-1", {})] }
        : { count: runs.length, next: null, previous: null, results: runs },
    );
    const high = await screen.findByRole("checkbox", { name: "Compare lr-high-3" });
    expect(screen.getByText("Tick runs of one workflow to compare their metrics.")).toBeInTheDocument();

    fireEvent.click(high);
    const bar = screen.getByRole("group", { name: "Compare runs" });
    expect(bar).toHaveTextContent("1 run of train picked");
    expect(within(bar).getByRole("button", { name: "Compare" })).toBeDisabled();
    const other = screen.getByRole("checkbox", { name: "Compare eval-2" });
    expect(other).toBeDisabled();
    expect(other).toHaveAttribute("title", "Compare runs of one workflow: train");

    fireEvent.click(screen.getByRole("checkbox", { name: "Compare lr-low-1" }));
    fireEvent.click(within(bar).getByRole("button", { name: "Compare 2 runs" }));
    expect(screen.getByRole("status", { name: "location" })).toHaveTextContent("/w/acme/compare?runs=lr-high-3,lr-low-1");
    expect(await screen.findByText("None of these runs recorded training metrics.")).toBeInTheDocument();
    expect(urls).toContain("/api/v1/workspaces/acme/metrics/compare/?runs=lr-high-3%2Clr-low-1");
  });

  it("clears the picked runs", async () => {
    const runs = [makeRun("lr-high-3", "train"), makeRun("eval-2", "eval")];
    renderAt("/w/acme/runs", () => ({ count: runs.length, next: null, previous: null, results: runs }));
    fireEvent.click(await screen.findByRole("checkbox", { name: "Compare lr-high-3" }));
    fireEvent.click(screen.getByRole("button", { name: "Clear" }));
    expect(screen.getByRole("checkbox", { name: "Compare lr-high-3" })).not.toBeChecked();
    expect(screen.getByRole("checkbox", { name: "Compare eval-2" })).toBeEnabled();
  });

  it("overlays the runs' curves and puts their final values, parameters, commit and cost side by side", async () => {
    const answer: CompareAnswer = {
      runs: [
        compared("lr-high-3", {
          params: { "-e LR": "sha:1a2b3c4d", "-e EPOCHS": "sha:99aa0011", "var batch": "32" },
          cost: "1.2345",
          last: { loss: 0.31 },
          series: [{ name: "loss", job: "train", x: "step", points: { x: [1, 2, 3], y: [0.9, 0.5, 0.31], attempt: [1, 1, 1] } }],
        }),
        compared("lr-low-1", {
          params: { "-e LR": "sha:5e6f7a8b", "-e EPOCHS": "sha:99aa0011", "var batch": "32" },
          commit: "fedcba9876543210fedcba9876543210fedcba98",
          last: { loss: 0.62 },
          series: [{ name: "loss", job: "train", x: "step", points: { x: [1, 2, 3], y: [0.95, 0.8, 0.62], attempt: [1, 1, 2] } }],
        }),
        compared("lr-mid-2", {
          params: { "-e LR": "sha:0c0d0e0f", "-e EPOCHS": "sha:99aa0011", "var batch": "64" },
          cost: "0.5",
          last: { loss: 0.4 },
          series: [{ name: "loss", job: "train", x: "step", points: { x: [1, 2], y: [0.9, 0.4], attempt: [1, 1] } }],
        }),
      ],
    };
    const urls = renderAt("/w/acme/compare?runs=lr-high-3,lr-low-1,lr-mid-2", () => answer);
    const table = await screen.findByRole("table", { name: "Compared runs" });
    expect(urls).toEqual(["/api/v1/workspaces/acme/metrics/compare/?runs=lr-high-3%2Clr-low-1%2Clr-mid-2"]);

    const heads = within(table).getAllByRole("columnheader").slice(1);
    expect(heads.map((h) => h.textContent)).toEqual(["lr-high-3", "lr-low-1", "lr-mid-2"]);
    expect(within(heads[0]).getByRole("link")).toHaveAttribute("href", "/w/acme/runs/lr-high-3?tab=metrics");
    const row = (label: string) => within(table).getByRole("rowheader", { name: label }).closest("tr") as HTMLElement;
    const cells = (label: string) => within(row(label)).getAllByRole("cell").map((c) => c.textContent);
    expect(cells("Cost")).toEqual(["$1.23", "unknown", "$0.50"]);
    expect(cells("Commit")).toEqual(["0123456789ab", "fedcba987654", "0123456789ab"]);
    expect(cells("-e LR")).toEqual(["sha:1a2b3c4d", "sha:5e6f7a8b", "sha:0c0d0e0f"]);
    expect(within(row("-e LR")).getAllByRole("cell")[0]).toHaveClass("differs");
    expect(within(row("-e EPOCHS")).getAllByRole("cell")[0]).not.toHaveClass("differs");
    expect(cells("var batch")).toEqual(["32", "32", "64"]);
    expect(screen.getByText(/values are secrets/)).toHaveTextContent("-e values are secrets: each is shown as a short digest of its value");
    expect(cells("loss")).toEqual(["0.31", "0.62", "0.4"]);

    const curve = await screen.findByRole("figure", { name: "loss chart" });
    expect(curve).toHaveAttribute("data-points", "8");
    const legend = [...curve.querySelectorAll("[data-line]")].map((item) => item.textContent);
    expect(legend).toEqual(["lr-high-30.31", "lr-low-10.62", "lr-mid-20.4"]);
  });

  it("asks for two runs at least", async () => {
    renderAt("/w/acme/compare?runs=lr-high-3", () => ({}));
    expect(await screen.findByText(/Pick two to 10 runs of one workflow/)).toBeInTheDocument();
  });

  it("shows the server's message for runs it cannot compare", async () => {
    const message = "Runs a-1 and b-2 are of different workflows (train, eval): compare runs of one workflow.";
    renderAt("/w/acme/compare?runs=a-1,b-2", () => ({ message }), 400);
    expect(await screen.findByRole("alert")).toHaveTextContent(message);
    expect(screen.queryByRole("table")).toBeNull();
  });
});
