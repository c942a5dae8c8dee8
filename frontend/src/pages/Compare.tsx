// Runs of one workflow side by side (/w/<ws>/compare?runs=a,b,c): their
// curves overlaid (by step, or by time since each run's first point), and a
// table of their final values, -e parameters, commit and cost. The runs are
// picked with the runs list's checkboxes.
import { lazy, Suspense, useMemo } from "react";
import { Link, useSearchParams } from "react-router-dom";
import { compareRuns, type CompareAnswer, type ComparedRun } from "../api/metrics";
import { ErrorBanner, Loading, PageHeader, StatusBadge } from "../components/ui";
import { useResource } from "../lib/hooks";
import { alignLines, colorAt, compareLines, comparedNames, formatValue, trimmed } from "../lib/metrics";
import { useWorkspace } from "../workspace";
import { MAX_COMPARED } from "./Runs";

// uPlot loads with the charts, not with every page.
const MetricChart = lazy(() => import("../components/MetricChart").then((module) => ({ default: module.MetricChart })));


export function ComparePage() {
  const { slug } = useWorkspace();
  const [params] = useSearchParams();
  const names = useMemo(
    () => [...new Set((params.get("runs") ?? "").split(",").map((n) => n.trim()).filter(Boolean))],
    [params],
  );
  const key = names.length >= 2 ? `${slug}|${names.join(",")}` : null;
  const answer = useResource<CompareAnswer>(key, () => compareRuns(slug, names));

  return (
    <div className="compare-page">
      <nav aria-label="Breadcrumb" className="breadcrumb">
        <Link to={`/w/${slug}/runs`}>Runs</Link> /
      </nav>
      <PageHeader title="Compare runs" />
      {names.length < 2 ? (
        <p className="muted">
          Pick two to {MAX_COMPARED} runs of one workflow with the checkboxes of the <Link to={`/w/${slug}/runs`}>runs list</Link>, then Compare.
        </p>
      ) : null}
      <ErrorBanner error={answer.error} />
      {key && !answer.data && !answer.error ? <Loading label="Loading the runs' metrics…" /> : null}
      {answer.data ? <Comparison runs={answer.data.runs} /> : null}
    </div>
  );
}

function Comparison({ runs }: { runs: ComparedRun[] }) {
  const curves = useMemo(() => comparedNames(runs), [runs]);
  return (
    <div className="metrics-panel">
      <ComparedTable runs={runs} />
      <section aria-labelledby="compare-curves" className="metrics-section">
        <h3 id="compare-curves">Curves</h3>
        {curves.length ? (
          <Suspense fallback={<Loading label="Loading the charts…" />}>
            <div className="metrics-grid">
              {curves.map((curve) => (
                <CompareChart key={`${curve.name}|${curve.x}`} runs={runs} name={curve.name} kind={curve.x} />
              ))}
            </div>
          </Suspense>
        ) : (
          <p className="muted small">None of these runs recorded training metrics.</p>
        )}
      </section>
    </div>
  );
}

function CompareChart({ runs, name, kind }: { runs: ComparedRun[]; name: string; kind: "step" | "time" }) {
  const shaped = useMemo(() => {
    const lines = compareLines(runs, name, kind);
    const jobsPerRun = new Map<string, number>();
    for (const line of lines) jobsPerRun.set(line.run, (jobsPerRun.get(line.run) ?? 0) + 1);
    return {
      data: alignLines(lines),
      lines: lines.map((line) => ({
        label: (jobsPerRun.get(line.run) ?? 0) > 1 ? `${line.run} · ${line.job}` : line.run,
        color: colorAt(runs.findIndex((r) => r.run === line.run)),
      })),
    };
  }, [runs, name, kind]);
  return (
    <MetricChart title={kind === "time" ? `${name} (by time since start)` : name} unit="" xKind={kind === "time" ? "elapsed" : "step"} lines={shaped.lines} data={shaped.data} />
  );
}

function ComparedTable({ runs }: { runs: ComparedRun[] }) {
  const { slug } = useWorkspace();
  const params = [...new Set(runs.flatMap((r) => Object.keys(r.params)))].sort();
  const finals = [...new Set(runs.flatMap((r) => Object.keys(r.last)))];
  const differs = (values: string[]) => new Set(values).size > 1;
  const row = (label: string, values: string[], mono = false) => (
    <tr key={label} className={differs(values) ? "row-differs" : undefined}>
      <th scope="row">{label}</th>
      {values.map((value, i) => (
        <td key={runs[i].run} className={`${mono ? "mono" : ""} ${differs(values) ? "differs" : ""}`.trim() || undefined}>
          {value}
        </td>
      ))}
    </tr>
  );
  const secret = params.some((p) => p.startsWith("-e "));
  return (
    <div>
      <div className="table-wrap">
        <table className="table compare-table" aria-label="Compared runs">
          <thead>
            <tr>
              <th scope="col">
                <span className="visually-hidden">Field</span>
              </th>
              {runs.map((run, i) => (
                <th key={run.run} scope="col" data-run={run.run}>
                  <span className="compare-run-head">
                    <span className="metric-swatch" ref={(el) => paint(el, colorAt(i))} aria-hidden="true" />
                    <Link to={`/w/${slug}/runs/${run.run}?tab=metrics`} className="run-link">
                      {run.run}
                    </Link>
                  </span>
                </th>
              ))}
            </tr>
          </thead>
          <tbody>
            <tr>
              <th scope="row">Status</th>
              {runs.map((run) => (
                <td key={run.run}>
                  <StatusBadge status={run.status} />
                </td>
              ))}
            </tr>
            {row("Workflow", runs.map((r) => r.workflow))}
            {row("Commit", runs.map((r) => (r.commit ? r.commit.slice(0, 12) : "—")), true)}
            {row("Cost", runs.map((r) => (r.cost === null ? "unknown" : `$${Number(r.cost).toFixed(2)}`)))}
            {params.length ? (
              <tr className="compare-group">
                <th scope="rowgroup" colSpan={runs.length + 1}>
                  Parameters
                </th>
              </tr>
            ) : null}
            {params.map((p) => row(p, runs.map((r) => r.params[p] ?? "—"), true))}
            {finals.length ? (
              <tr className="compare-group">
                <th scope="rowgroup" colSpan={runs.length + 1}>
                  Final values
                </th>
              </tr>
            ) : null}
            {finals.map((name) => row(name, runs.map((r) => (r.last[name] === undefined ? "—" : formatFinal(r.last[name])))))}
          </tbody>
        </table>
      </div>
      {secret ? (
        <p className="small muted compare-note">
          <code>-e</code> values are secrets: each is shown as a short digest of its value, the same digest for the same value.
        </p>
      ) : null}
    </div>
  );
}

/** A run's colour, set through the CSSOM. */
function paint(element: HTMLElement | null, colour: string): void {
  if (element) element.style.backgroundColor = colour;
}

function formatFinal(value: number): string {
  return Number.isFinite(value) ? trimmed(value) : formatValue(value, "");
}
