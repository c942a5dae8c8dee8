import { fireEvent, render, screen, waitFor, within } from "@testing-library/react";
import { MemoryRouter } from "react-router-dom";
import { afterEach, describe, expect, it, vi } from "vitest";
import type { Budgets, CostReport, Role } from "../api/types";
import { buckets, bucketOf, periodWindow, share, units, decimal } from "../lib/costs";
import { CostsPage } from "../pages/Costs";
import { WorkspaceContext, workspaceState } from "../workspace";

function report(by: string, rows: [string, string][], idle: string): CostReport {
  const total = decimal(rows.reduce((sum, [, cost]) => sum + units(cost), units(idle)));
  return { currency: "USD", since: "2026-12-01T00:00:00Z", until: "2026-12-05T23:00:00Z", by: by as CostReport["by"], total, idle, rows: rows.map(([key, cost]) => ({ key, cost })) };
}

const IDLE = "0.5010";
const REPORTS: Record<string, CostReport> = {
  user: report("user", [["alice", "12.3456"], ["bob", "0.7010"]], IDLE),
  workflow: report("workflow", [["train", "12.0000"], ["eval", "1.0466"]], IDLE),
  backend: report("backend", [["aws", "13.0466"]], IDLE),
  day: report("day", [["2026-12-01", "10.0000"], ["2026-12-03", "3.0466"]], IDLE),
};

// The contract's budgets shape (docs/COST.md, "Budgets and quotas").
const BUDGETS: Budgets = {
  currency: "USD",
  month: "2026-12",
  budgets: [
    { user: null, monthly_limit: "500.00", gpu_quota: null, warn_percent: 80, spent: "413.5500", rate_per_hour: "3.0000", percent: 82.7, gpus_running: null },
    { user: "alice", monthly_limit: "100.00", gpu_quota: 4, warn_percent: 80, spent: "24.7000", rate_per_hour: "1.2000", percent: 24.7, gpus_running: 2 },
  ],
};

type Call = { method: string; url: string; body: unknown };

function serve(budgets: Response | (() => Response), answers: Record<string, () => Response> = {}) {
  const calls: Call[] = [];
  vi.stubGlobal(
    "fetch",
    vi.fn(async (url: string, init: RequestInit = {}) => {
      const method = init.method ?? "GET";
      calls.push({ method, url, body: init.body ? JSON.parse(String(init.body)) : undefined });
      const path = url.split("?")[0];
      const answer = answers[`${method} ${path}`];
      if (answer) return answer();
      if (path.endsWith("/costs/")) {
        const by = new URL(url, "http://x").searchParams.get("by") ?? "user";
        return new Response(JSON.stringify(REPORTS[by]));
      }
      if (path.endsWith("/budgets/")) return typeof budgets === "function" ? budgets() : budgets.clone();
      return new Response("{}", { status: 404 });
    }),
  );
  return calls;
}

function renderPage(role: Role = "admin", at = "/w/acme/costs") {
  const workspace = workspaceState({ slug: "acme", name: "Acme", role }, [], async () => {});
  render(
    <WorkspaceContext.Provider value={workspace}>
      <MemoryRouter initialEntries={[at]}>
        <CostsPage />
      </MemoryRouter>
    </WorkspaceContext.Provider>,
  );
}

const json = (body: unknown, status = 200) => new Response(JSON.stringify(body), { status });

afterEach(() => {
  vi.unstubAllGlobals();
  vi.useRealTimers();
});

describe("costs arithmetic", () => {
  it("sums the API's decimal strings exactly and says shares to a tenth", () => {
    expect(decimal(units("0.1000") + units("0.2000"))).toBe("0.3000");
    expect(decimal(units("12.3456") + units("0.7010") + units("0.5010"))).toBe("13.5476");
    expect(share("0.7010", "13.5476")).toBe(5.1);
    expect(share("1", "0.0000")).toBe(0);
  });

  it("makes UTC windows of calendar months and of days back", () => {
    const now = new Date("2026-12-05T23:44:00Z");
    expect(periodWindow("this-month", now)).toEqual({ since: new Date("2026-12-01T00:00:00Z"), until: null });
    expect(periodWindow("last-month", now)).toEqual({ since: new Date("2026-11-01T00:00:00Z"), until: new Date("2026-12-01T00:00:00Z") });
    expect(periodWindow("last-month", new Date("2026-01-10T00:00:00Z")).since).toEqual(new Date("2025-12-01T00:00:00Z"));
    expect(periodWindow("7d", now).since).toEqual(new Date("2026-11-28T23:44:00Z"));
  });

  it("fills every day of the window and sums days into Monday weeks and months", () => {
    const window = { since: new Date("2026-11-28T00:00:00Z"), until: new Date("2026-12-08T00:00:00Z") };
    const days = [
      { key: "2026-11-29", cost: "1.0000" },
      { key: "2026-11-30", cost: "2.5000" },
      { key: "2026-12-06", cost: "0.2500" },
      { key: "2026-12-07", cost: "4.0000" },
    ];
    const byDay = buckets(days, "day", window);
    expect(byDay).toHaveLength(10);
    expect(byDay[0]).toEqual({ key: "2026-11-28", label: "Nov 28", cost: "0.0000" });
    expect(bucketOf("2026-12-06", "week")).toBe("2026-11-30"); // a Sunday: its week began on Monday the 30th
    expect(buckets(days, "week", window).map((b) => [b.key, b.label, b.cost])).toEqual([
      ["2026-11-23", "Nov 23–29", "1.0000"],
      ["2026-11-30", "Nov 30 – Dec 6", "2.7500"],
      ["2026-12-07", "Dec 7–13", "4.0000"],
    ]);
    expect(buckets(days, "month", window).map((b) => [b.label, b.cost])).toEqual([
      ["Nov 2026", "3.5000"],
      ["Dec 2026", "4.2500"],
    ]);
  });
});

describe("CostsPage", () => {
  it("shows the month's total, the idle line, and tables that add up to it", async () => {
    const calls = serve(json(BUDGETS));
    renderPage();

    expect(await screen.findByTestId("cost-total")).toHaveTextContent("$13.55");
    expect(screen.getByTestId("cost-idle")).toHaveTextContent("$0.50");
    expect(screen.getByTestId("cost-jobs")).toHaveTextContent("$13.05");
    const users = within(screen.getByRole("table", { name: "By user" }));
    expect(users.getByText("alice").closest("tr")).toHaveTextContent("$12.35");
    expect(users.getByText("bob").closest("tr")).toHaveTextContent("$0.70");
    expect(users.getByText("Idle machines").closest("tr")).toHaveTextContent("$0.50");
    expect(users.getByText("Total").closest("tr")).toHaveTextContent("$13.55");
    expect(screen.getByRole("meter", { name: "bob: 5.1% of the total" })).toBeInTheDocument();
    expect(within(screen.getByRole("table", { name: "By workflow" })).getByText("train")).toBeInTheDocument();
    expect(within(screen.getByRole("table", { name: "By backend" })).getByText("aws")).toBeInTheDocument();

    // This month: since the month's first day (UTC), until now (the API's default).
    const costCalls = calls.filter((c) => c.url.includes("/costs/"));
    expect(costCalls.map((c) => new URL(c.url, "http://x").searchParams.get("by")).sort()).toEqual(["backend", "day", "user", "workflow"]);
    const since = new URL(costCalls[0].url, "http://x").searchParams.get("since")!;
    expect(since).toMatch(/^\d{4}-\d{2}-01T00:00:00\.000Z$/);
    expect(new URL(costCalls[0].url, "http://x").searchParams.has("until")).toBe(false);
  });

  it("asks for last month's window and draws the days summed by week", async () => {
    const calls = serve(json(BUDGETS));
    renderPage("viewer", "/w/acme/costs?period=last-month");
    await screen.findByTestId("cost-total");
    const asked = new URL(calls.find((c) => c.url.includes("/costs/"))!.url, "http://x").searchParams;
    expect(asked.get("until")).toMatch(/-01T00:00:00\.000Z$/);

    fireEvent.click(screen.getByRole("button", { name: "Month" }));
    expect(await screen.findByRole("heading", { name: "Spending by month" })).toBeInTheDocument();
    fireEvent.click(screen.getByRole("button", { name: "Week" }));
    const bars = document.querySelectorAll(".cost-chart-bar");
    expect(bars.length).toBeGreaterThanOrEqual(4);
    expect(screen.getByRole("button", { name: "Week" })).toHaveAttribute("aria-pressed", "true");
  });

  it("shows each budget's spend against its limit, the bar amber past the warning", async () => {
    serve(json(BUDGETS));
    renderPage("member");

    const workspace = await screen.findByRole("meter", { name: "Workspace: 82.7% of the budget used" });
    expect(workspace.className).toContain("share-bar-warn");
    const row = workspace.closest("tr")!;
    expect(row).toHaveTextContent("$413.55");
    expect(row).toHaveTextContent("$500.00");
    expect(row).toHaveTextContent("$3.00/h");
    const alice = screen.getByRole("meter", { name: "alice: 24.7% of the budget used" }).closest("tr")!;
    expect(alice).toHaveTextContent("2 of 4");
    expect(screen.getByText(/December 2026/)).toBeInTheDocument();
    // Members read budgets; only admins set them.
    expect(screen.queryByRole("form", { name: "Workspace budget" })).toBeNull();
  });

  it("says no budget is set when there is none, and an admin sets the workspace's", async () => {
    let budgets: Budgets = { currency: "USD", month: "2026-12", budgets: [] };
    const calls = serve(() => json(budgets), {
      "PUT /api/v1/workspaces/acme/budgets/workspace/": () => {
        budgets = { ...BUDGETS, budgets: [{ ...BUDGETS.budgets[0], monthly_limit: "250.00", percent: 10, spent: "25.0000", warn_percent: 75 }] };
        return json(budgets.budgets[0]);
      },
    });
    renderPage("admin");

    expect(await screen.findByText(/No budget set/)).toBeInTheDocument();
    const form = screen.getByRole("form", { name: "Workspace budget" });
    fireEvent.change(within(form).getByLabelText(/Monthly limit/), { target: { value: "250" } });
    fireEvent.change(within(form).getByLabelText(/Warn at/), { target: { value: "75" } });
    fireEvent.click(within(form).getByRole("button", { name: "Set budget" }));

    expect(await screen.findByRole("meter", { name: "Workspace: 10% of the budget used" })).toBeInTheDocument();
    expect(calls.find((c) => c.method === "PUT")?.body).toEqual({ monthly_limit: "250", gpu_quota: null, warn_percent: 75 });
    expect(screen.queryByText(/No budget set/)).toBeNull();
  });

  it("shows the server's refusal of a budget in the form", async () => {
    serve(json({ ...BUDGETS, budgets: [BUDGETS.budgets[0]] }), {
      "PUT /api/v1/workspaces/acme/budgets/workspace/": () => json({ message: "monthly_limit: -5 is negative; give an amount of USD of 0 or more.", extra: {} }, 400),
    });
    renderPage("admin");
    const form = await screen.findByRole("form", { name: "Workspace budget" });
    expect(within(form).getByLabelText(/Monthly limit/)).toHaveValue("500.00");
    fireEvent.change(within(form).getByLabelText(/Monthly limit/), { target: { value: "-5" } });
    fireEvent.click(within(form).getByRole("button", { name: "Save budget" }));
    expect(await within(form).findByText(/-5 is negative/)).toBeInTheDocument();
  });

  it("asks for a limit instead of sending an empty one", async () => {
    const calls = serve(json({ ...BUDGETS, budgets: [BUDGETS.budgets[0]] }));
    renderPage("admin");
    const form = await screen.findByRole("form", { name: "Workspace budget" });
    fireEvent.change(within(form).getByLabelText(/Monthly limit/), { target: { value: "  " } });
    fireEvent.click(within(form).getByRole("button", { name: "Save budget" }));
    expect(await within(form).findByText("Enter a monthly limit, or remove the budget.")).toBeInTheDocument();
    expect(calls.filter((c) => c.method === "PUT")).toEqual([]);
  });

  it("has no budgets panel where the server has no budgets (404), and the costs still show", async () => {
    serve(json({ message: "Not found.", extra: {} }, 404));
    renderPage("admin");
    expect(await screen.findByTestId("cost-total")).toHaveTextContent("$13.55");
    await waitFor(() => expect(screen.queryByRole("heading", { name: /Budgets/ })).toBeNull());
    expect(screen.queryByRole("form", { name: "Workspace budget" })).toBeNull();
    expect(screen.queryByRole("alert")).toBeNull();
  });
});
