import { useState, type FormEvent, type ReactNode } from "react";
import { useSearchParams } from "react-router-dom";
import { ApiError, del, get, put, wsPath } from "../api/client";
import type { Budget, Budgets, CostReport } from "../api/types";
import { CostChart } from "../components/CostChart";
import { ConfirmButton, ErrorBanner, Loading, PageHeader } from "../components/ui";
import { buckets, decimal, PERIODS, periodWindow, share, units, type Grouping, type Period, type Window } from "../lib/costs";
import { money } from "../lib/format";
import { useInterval, useResource } from "../lib/hooks";
import { useWorkspace } from "../workspace";

const GROUPINGS: { value: Grouping; label: string }[] = [
  { value: "day", label: "Day" },
  { value: "week", label: "Week" },
  { value: "month", label: "Month" },
];
const BREAKDOWNS = [
  { by: "user", title: "By user" },
  { by: "workflow", title: "By workflow" },
  { by: "backend", title: "By backend" },
] as const;
type Breakdown = (typeof BREAKDOWNS)[number]["by"];
type Reports = Record<Breakdown | "day", CostReport>;

const REFRESH_MS = 60_000;

function isPeriod(value: string | null): value is Period {
  return PERIODS.some((p) => p.value === value);
}

function isGrouping(value: string | null): value is Grouping {
  return GROUPINGS.some((g) => g.value === value);
}

/**
 * What the workspace spent (docs/COST.md, "Where costs are shown"): the
 * period's total and idle line, a chart by day, week or month, the totals by
 * user, workflow and backend, and the month's budgets. Each table adds up to
 * the total: its rows, then the idle line.
 */
export function CostsPage() {
  const { slug } = useWorkspace();
  const [params, setParams] = useSearchParams();
  const period: Period = isPeriod(params.get("period")) ? (params.get("period") as Period) : "this-month";
  const grouping: Grouping = isGrouping(params.get("group")) ? (params.get("group") as Grouping) : "day";
  const window = periodWindow(period);
  const query = { since: window.since.toISOString(), until: window.until?.toISOString() };

  const reports = useResource<Reports>(`${slug}|${period}`, async () => {
    const [user, workflow, backend, day] = await Promise.all(
      (["user", "workflow", "backend", "day"] as const).map((by) => get<CostReport>(wsPath(slug, "costs/"), { ...query, by })),
    );
    return { user, workflow, backend, day };
  });
  useInterval(() => void reports.reload(), period === "last-month" ? null : REFRESH_MS);

  const choose = (name: string, value: string) => {
    const next = new URLSearchParams(params);
    next.set(name, value);
    setParams(next, { replace: true });
  };

  const data = reports.data;
  return (
    <>
      <PageHeader title="Costs">
        <label className="inline-label">
          Period
          <select value={period} onChange={(e) => choose("period", e.target.value)}>
            {PERIODS.map((p) => (
              <option key={p.value} value={p.value}>
                {p.label}
              </option>
            ))}
          </select>
        </label>
      </PageHeader>
      <p className="lede">
        What this workspace’s machines cost, in USD: each attempt by the UTC day it started, and the machines’ idle time. <WindowText window={window} />
      </p>
      <ErrorBanner error={reports.error} />
      {!data ? (
        reports.error ? null : <Loading />
      ) : (
        <>
          <Summary report={data.user} period={PERIODS.find((p) => p.value === period)?.label ?? ""} />
          <section className="card cost-chart-card" aria-labelledby="costs-chart">
            <div className="card-head">
              <h2 id="costs-chart">Spending by {grouping}</h2>
              <div className="segmented" role="group" aria-label="Group the chart by">
                {GROUPINGS.map((g) => (
                  <button
                    key={g.value}
                    type="button"
                    className={`btn btn-small ${g.value === grouping ? "btn-active" : ""}`}
                    aria-pressed={g.value === grouping}
                    onClick={() => choose("group", g.value)}
                  >
                    {g.label}
                  </button>
                ))}
              </div>
            </div>
            <CostChart buckets={buckets(data.day.rows, grouping, window)} caption={`Jobs' cost by ${grouping}`} />
            <p className="small muted cost-chart-note">Attempts only: the idle line ({money(data.day.idle)}) is not spread over days.</p>
          </section>
          <div className="cost-breakdowns">
            {BREAKDOWNS.map(({ by, title }) => (
              <BreakdownTable key={by} title={title} by={by} report={data[by]} />
            ))}
          </div>
        </>
      )}
      <BudgetsPanel />
    </>
  );
}

function WindowText({ window }: { window: Window }) {
  const day = (date: Date) => date.toLocaleDateString("en-US", { month: "short", day: "numeric", year: "numeric", timeZone: "UTC" });
  const end = window.until ? day(new Date(window.until.getTime() - 1)) : "now";
  return (
    <span>
      {day(window.since)} – {end} (UTC).
    </span>
  );
}

function Summary({ report, period }: { report: CostReport; period: string }) {
  const jobs = decimal(units(report.total) - units(report.idle));
  return (
    <dl className="cost-summary" aria-label="Totals">
      <Stat label={`Total · ${period}`} value={report.total} testId="cost-total" big />
      <Stat label="Jobs" value={jobs} testId="cost-jobs" note={`${report.rows.length} ${report.rows.length === 1 ? "person" : "people"}`} />
      <Stat label="Idle machines" value={report.idle} testId="cost-idle" note="machines up with no job" />
    </dl>
  );
}

function Stat({ label, value, testId, note, big = false }: { label: string; value: string; testId: string; note?: ReactNode; big?: boolean }) {
  return (
    <div className={`stat card ${big ? "stat-big" : ""}`}>
      <dt>{label}</dt>
      <dd data-testid={testId} data-amount={value} title={`$${value}`}>
        {money(value)}
      </dd>
      {note ? <dd className="small muted">{note}</dd> : null}
    </div>
  );
}

/** A share of a whole as a thin bar; its width is set through the CSSOM (the policy refuses style attributes). */
function ShareBar({ percent, label, tone = "" }: { percent: number; label: string; tone?: string }) {
  const width = `${Math.max(0, Math.min(100, percent))}%`;
  return (
    <span className={`share-bar ${tone}`} role="meter" aria-label={label} aria-valuenow={Math.round(percent * 10) / 10} aria-valuemin={0} aria-valuemax={100}>
      <span className="share-bar-fill" ref={(el) => void (el && (el.style.width = width))} />
    </span>
  );
}

function BreakdownTable({ title, by, report }: { title: string; by: Breakdown; report: CostReport }) {
  const id = `costs-by-${by}`;
  return (
    <section className="card cost-breakdown" aria-labelledby={id}>
      <h2 id={id}>{title}</h2>
      <table className="table cost-table" aria-labelledby={id} data-by={by}>
        <thead>
          <tr>
            <th scope="col">{by === "user" ? "User" : by === "workflow" ? "Workflow" : "Backend"}</th>
            <th scope="col" className="num">
              Cost
            </th>
            <th scope="col" className="share-col">
              <span className="visually-hidden">Share of the total</span>
            </th>
          </tr>
        </thead>
        <tbody>
          {report.rows.length ? (
            report.rows.map((row) => {
              const percent = share(row.cost, report.total);
              return (
                <tr key={row.key} data-key={row.key}>
                  <td className={by === "user" ? "" : "mono"}>{row.key}</td>
                  <td className="num" data-amount={row.cost} title={`$${row.cost}`}>
                    {money(row.cost)}
                  </td>
                  <td className="share-col">
                    <ShareBar percent={percent} label={`${row.key}: ${percent}% of the total`} />
                    <span className="small muted share-pct">{percent.toFixed(0)}%</span>
                  </td>
                </tr>
              );
            })
          ) : (
            <tr>
              <td colSpan={3} className="muted">
                No attempts in this period.
              </td>
            </tr>
          )}
        </tbody>
        <tfoot>
          <tr className="idle-row" data-key="(idle)">
            <td className="muted">Idle machines</td>
            <td className="num muted" data-amount={report.idle}>
              {money(report.idle)}
            </td>
            <td />
          </tr>
          <tr className="total-row">
            <th scope="row">Total</th>
            <td className="num" data-amount={report.total}>
              {money(report.total)}
            </td>
            <td />
          </tr>
        </tfoot>
      </table>
    </section>
  );
}

/** The budgets' answer; null: this server has no budgets (the endpoint answers 404). */
async function loadBudgets(slug: string): Promise<Budgets | null> {
  try {
    return await get<Budgets>(wsPath(slug, "budgets/"));
  } catch (caught) {
    if (caught instanceof ApiError && caught.status === 404) return null;
    throw caught;
  }
}

function monthName(month: string): string {
  const [year, number] = month.split("-").map(Number);
  if (!year || !number) return month;
  return new Date(Date.UTC(year, number - 1, 1)).toLocaleDateString("en-US", { month: "long", year: "numeric", timeZone: "UTC" });
}

/** A budget's bar: its own colour below the warning, amber from it, red at the limit. */
function tone(budget: Budget): string {
  if (budget.percent === null) return "";
  if (budget.percent >= 100) return "share-bar-over";
  if (budget.percent >= budget.warn_percent) return "share-bar-warn";
  return "";
}

/**
 * The month's budgets (docs/COST.md, "Budgets and quotas"): each row's spend
 * against its limit, its rate, its GPUs against their quota; admins set or
 * remove the workspace's own. Not shown where the server has no budgets.
 */
export function BudgetsPanel() {
  const { slug, isAdmin } = useWorkspace();
  const budgets = useResource<Budgets | null>(`${slug}|budgets`, () => loadBudgets(slug));
  if (budgets.data === null) return null;
  const rows = budgets.data?.budgets ?? [];
  const own = rows.find((b) => b.user === null) ?? null;
  return (
    <section className="card budgets" aria-labelledby="budgets-title">
      <div className="card-head">
        <h2 id="budgets-title">Budgets{budgets.data ? <span className="muted"> · {monthName(budgets.data.month)}</span> : null}</h2>
      </div>
      <ErrorBanner error={budgets.error} />
      {!budgets.data ? (
        budgets.error ? null : <Loading />
      ) : rows.length ? (
        <div className="table-wrap">
          <table className="table budgets-table">
            <thead>
              <tr>
                <th scope="col">Budget</th>
                <th scope="col" className="num">
                  Spent
                </th>
                <th scope="col" className="num">
                  Limit
                </th>
                <th scope="col">Used</th>
                <th scope="col" className="num">
                  Rate
                </th>
                <th scope="col" className="num">
                  GPUs
                </th>
              </tr>
            </thead>
            <tbody>
              {rows.map((budget) => (
                <BudgetRow key={budget.user ?? ""} budget={budget} />
              ))}
            </tbody>
          </table>
        </div>
      ) : (
        <p className="muted no-budget">No budget set: nothing stops or holds this workspace’s runs for what they cost.</p>
      )}
      {isAdmin && budgets.data ? <WorkspaceBudgetForm slug={slug} current={own} onSaved={budgets.reload} /> : null}
    </section>
  );
}

function BudgetRow({ budget }: { budget: Budget }) {
  const who = budget.user === null ? "Workspace" : budget.user;
  return (
    <tr data-budget={budget.user ?? "workspace"}>
      <td>
        {budget.user === null ? <strong>Workspace</strong> : budget.user}
        <div className="small muted">warns at {budget.warn_percent}%</div>
      </td>
      <td className="num" data-amount={budget.spent}>
        {money(budget.spent)}
      </td>
      <td className="num">{budget.monthly_limit === null ? <span className="muted">no limit</span> : money(budget.monthly_limit)}</td>
      <td className="budget-used">
        {budget.percent === null ? (
          <span className="muted">—</span>
        ) : (
          <>
            <ShareBar percent={budget.percent} label={`${who}: ${budget.percent}% of the budget used`} tone={tone(budget)} />
            <span className="small share-pct">{budget.percent.toFixed(1)}%</span>
          </>
        )}
      </td>
      <td className="num">{money(budget.rate_per_hour)}/h</td>
      <td className="num">
        {budget.gpu_quota === null ? (budget.gpus_running ?? <span className="muted">—</span>) : `${budget.gpus_running ?? 0} of ${budget.gpu_quota}`}
      </td>
    </tr>
  );
}

function WorkspaceBudgetForm({ slug, current, onSaved }: { slug: string; current: Budget | null; onSaved: () => Promise<void> }) {
  const [limit, setLimit] = useState(current?.monthly_limit ?? "");
  const [warn, setWarn] = useState(String(current?.warn_percent ?? 80));
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const path = wsPath(slug, "budgets/workspace/");

  const save = async (event: FormEvent) => {
    event.preventDefault();
    setError(null);
    setBusy(true);
    if (!limit.trim()) {
      setError(current ? "Enter a monthly limit, or remove the budget." : "Enter a monthly limit in USD, e.g. 500.");
      setBusy(false);
      return;
    }
    try {
      await put(path, { monthly_limit: limit.trim(), gpu_quota: current?.gpu_quota ?? null, warn_percent: Number(warn) });
      await onSaved();
    } catch (caught) {
      setError(caught instanceof Error ? caught.message : String(caught));
    } finally {
      setBusy(false);
    }
  };
  const remove = async () => {
    setError(null);
    try {
      await del(path);
      setLimit("");
      await onSaved();
    } catch (caught) {
      setError(caught instanceof Error ? caught.message : String(caught));
    }
  };

  return (
    <form className="inline-form budget-form" onSubmit={save} aria-label="Workspace budget">
      <label>
        Monthly limit (USD)
        <input inputMode="decimal" value={limit} onChange={(e) => setLimit(e.target.value)} placeholder="500" spellCheck={false} />
      </label>
      <label>
        Warn at (%)
        <input type="number" min={1} max={99} value={warn} onChange={(e) => setWarn(e.target.value)} className="input-short" />
      </label>
      <button type="submit" className="btn btn-primary" disabled={busy}>
        {busy ? "Saving…" : current ? "Save budget" : "Set budget"}
      </button>
      {current ? <ConfirmButton label="Remove" confirmLabel="Remove the workspace budget" onConfirm={remove} className="btn btn-danger" /> : null}
      <ErrorBanner error={error} />
    </form>
  );
}
