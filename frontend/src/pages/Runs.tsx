import { useEffect, useState, type FormEvent } from "react";
import { Link, useNavigate, useSearchParams } from "react-router-dom";
import { get, wsPath } from "../api/client";
import { useLiveFrames } from "../api/live";
import type { Page, Run, RunStatus } from "../api/types";
import { DataTable } from "../components/DataTable";
import { CopyButton, EmptyState, ErrorBanner, Loading, PageHeader, StatusBadge, Time } from "../components/ui";
import { codeLabel, elapsedSeconds, humanDuration, money } from "../lib/format";
import { useNow, useResource } from "../lib/hooks";
import { cliInstallCommand } from "../lib/install";
import { useWorkspace } from "../workspace";

export const PAGE_SIZE = 25;
/** The most runs one comparison takes (the compare API's bound). */
export const MAX_COMPARED = 10;
const STATUSES: RunStatus[] = ["pending", "running", "stopping", "succeeded", "failed", "stopped"];

export function RunsPage() {
  const { slug, canWrite } = useWorkspace();
  const [params, setParams] = useSearchParams();
  const status = params.get("status") ?? "";
  const workflow = params.get("workflow") ?? "";
  const q = params.get("q") ?? "";
  const tag = params.get("tag") ?? "";
  // Pages are keyset pages: the URL holds the opaque cursor of this page
  // ("" for the newest), and `trail` the cursors of the pages before it, for
  // Previous (after a reload it is empty: Previous goes to the newest page).
  const cursor = params.get("cursor") ?? "";
  const [trail, setTrail] = useState<string[]>([]);
  // Runs picked for Compare, in the order picked: all of one workflow.
  const [picked, setPicked] = useState<{ name: string; workflow: string }[]>([]);
  const navigate = useNavigate();
  const filtered = Boolean(status || workflow || q || tag);

  const key = `${slug}|${status}|${workflow}|${q}|${tag}|${cursor}`;
  const runs = useResource<Page<Run>>(key, () =>
    get<Page<Run>>(wsPath(slug, "runs/"), { status, workflow, q, tag, cursor, page_size: PAGE_SIZE }),
  );

  // Live: a changed run replaces its row; a new run matching the filters on
  // the first page is added at the top.
  useLiveFrames(wsPath(slug, "runs/").replace("/api/v1/", "/ws/v1/"), (frame) => {
    if (frame.type !== "run") return;
    const run = frame.run;
    runs.setData((previous) => {
      if (!previous) return previous as unknown as Page<Run>;
      const index = previous.results.findIndex((r) => r.id === run.id);
      if (index >= 0) {
        const results = previous.results.slice();
        results[index] = run;
        return { ...previous, results };
      }
      if (cursor || q || !matches(run, status, workflow, tag)) return previous;
      return {
        ...previous,
        count: previous.count + 1,
        results: [run, ...previous.results].slice(0, PAGE_SIZE),
      };
    });
  });

  const update = (changes: Record<string, string>) => {
    const next = new URLSearchParams(params);
    for (const [name, value] of Object.entries(changes)) {
      if (value) next.set(name, value);
      else next.delete(name);
    }
    if (!("cursor" in changes)) {
      next.delete("cursor");
      setTrail([]);
    }
    setParams(next);
  };
  const older = (link: string) => {
    setTrail([...trail, cursor]);
    update({ cursor: cursorOf(link) });
  };
  const newer = () => {
    setTrail(trail.slice(0, -1));
    update({ cursor: trail[trail.length - 1] ?? "" });
  };

  const data = runs.data;
  return (
    <>
      <PageHeader title="Runs">
        {canWrite ? (
          <Link className="btn btn-primary" to={`/w/${slug}/runs/new`}>
            New run
          </Link>
        ) : null}
      </PageHeader>
      <Filters status={status} workflow={workflow} q={q} tag={tag} runs={data?.results ?? []} onChange={update} />
      <ErrorBanner error={runs.error} />
      {!data && runs.loading ? <Loading /> : null}
      {data && data.count === 0 && !filtered ? <GettingStarted /> : null}
      {data && data.count === 0 && filtered ? (
        <EmptyState title="No runs match these filters">
          <button type="button" className="btn" onClick={() => setParams(new URLSearchParams())}>
            Clear filters
          </button>
        </EmptyState>
      ) : null}
      {data && data.count > 0 ? (
        <>
          <CompareBar picked={picked} onClear={() => setPicked([])} onCompare={() => navigate(`/w/${slug}/compare?runs=${picked.map((p) => encodeURIComponent(p.name)).join(",")}`)} />
          <RunsTable
            runs={data.results}
            workspace={slug}
            picked={picked.map((p) => p.name)}
            pickable={(run) => pickable(run, picked)}
            onPick={(run, on) => setPicked((was) => (on ? [...was, { name: run.name, workflow: run.workflow }] : was.filter((p) => p.name !== run.name)))}
          />
          <Pagination
            page={cursor && trail.length === 0 ? null : trail.length + 1}
            shown={data.results.length}
            count={data.count}
            estimated={Boolean(data.count_estimated)}
            onNewer={cursor ? newer : null}
            onOlder={data.next ? () => older(data.next ?? "") : null}
          />
        </>
      ) : null}
    </>
  );
}

/** Why `run` cannot join the picked runs ("" if it can). */
function pickable(run: Run, picked: { name: string; workflow: string }[]): string {
  if (picked.some((p) => p.name === run.name)) return "";
  if (picked.length && picked[0].workflow !== run.workflow) return `Compare runs of one workflow: ${picked[0].workflow}`;
  if (picked.length >= MAX_COMPARED) return `At most ${MAX_COMPARED} runs are compared at once`;
  return "";
}

function CompareBar({ picked, onCompare, onClear }: { picked: { workflow: string }[]; onCompare: () => void; onClear: () => void }) {
  return (
    <div className="compare-bar" role="group" aria-label="Compare runs">
      {picked.length ? (
        <>
          <span>
            {picked.length} run{picked.length === 1 ? "" : "s"} of <strong>{picked[0].workflow}</strong> picked
          </span>
          <button type="button" className="btn btn-small btn-primary" disabled={picked.length < 2} onClick={onCompare}>
            Compare{picked.length >= 2 ? ` ${picked.length} runs` : ""}
          </button>
          <button type="button" className="btn btn-small btn-ghost" onClick={onClear}>
            Clear
          </button>
          {picked.length < 2 ? <span className="muted small">Pick another run of {picked[0].workflow} to compare.</span> : null}
        </>
      ) : (
        <span className="muted small">Tick runs of one workflow to compare their metrics.</span>
      )}
    </div>
  );
}

export function RunsTable({
  runs,
  workspace,
  picked,
  pickable: why,
  onPick,
}: {
  runs: Run[];
  workspace: string;
  /** With these three, each row has a checkbox for Compare. */
  picked?: string[];
  pickable?: (run: Run) => string;
  onPick?: (run: Run, on: boolean) => void;
}) {
  const now = useNow(5_000);
  const picking = picked !== undefined && onPick !== undefined;
  return (
    <DataTable
      rows={runs}
      className="table runs-table"
      columns={[
        picking ? { label: <span className="visually-hidden">Compare</span>, className: "select" } : null,
        "Status",
        "Run",
        "Workflow",
        "Code",
        "By",
        "Submitted",
        { label: "Duration", className: "num" },
        { label: "Cost", className: "num" },
        "Tags",
      ]}
      renderRow={(run) => (
        <tr key={run.id} data-run={run.name} className={picking && picked.includes(run.name) ? "picked" : undefined}>
          {picking ? (
            <td className="select">
              <input
                type="checkbox"
                aria-label={`Compare ${run.name}`}
                checked={picked.includes(run.name)}
                disabled={Boolean(why?.(run))}
                title={why?.(run) || undefined}
                onChange={(event) => onPick(run, event.target.checked)}
              />
            </td>
          ) : null}
          <td>
            <StatusBadge status={run.status} />
          </td>
          <td>
            <Link to={`/w/${workspace}/runs/${run.name}`} className="run-link">
              {run.name}
            </Link>
          </td>
          <td>
            {run.workflow}
            {run.environment_build ? <span className="muted"> (environment build)</span> : null}
          </td>
          <td className="mono small" title={run.code?.commit ? `${codeLabel(run.code)} (${run.code.commit})` : undefined}>
            <span className="code-label">{codeLabel(run.code)}</span>
          </td>
          <td>{run.submitted_by || "—"}</td>
          <td>
            <Time iso={run.created_at} />
          </td>
          <td className="num">
            {humanDuration(run.duration_seconds ?? elapsedSeconds(run.started_at, run.finished_at, now))}
          </td>
          <td className={run.cost == null ? "num muted" : "num"} title={run.cost == null ? "No attempt held a machine" : `USD ${run.cost}: every attempt of every job`}>
            {money(run.cost)}
          </td>
          <td>
            <Tags tags={run.tags ?? []} workspace={workspace} />
          </td>
        </tr>
      )}
    />
  );
}

export function Tags({ tags, workspace }: { tags: string[]; workspace: string }) {
  if (!tags.length) return null;
  return (
    <span className="tags">
      {tags.map((tag) => (
        <Link key={tag} className="tag" to={`/w/${workspace}/runs?tag=${encodeURIComponent(tag)}`}>
          {tag}
        </Link>
      ))}
    </span>
  );
}

function Filters({
  status,
  workflow,
  q,
  tag,
  runs,
  onChange,
}: {
  status: string;
  workflow: string;
  q: string;
  tag: string;
  runs: Run[];
  onChange: (changes: Record<string, string>) => void;
}) {
  const [search, setSearch] = useState(q);
  const [workflowText, setWorkflowText] = useState(workflow);
  useEffect(() => setSearch(q), [q]);
  useEffect(() => setWorkflowText(workflow), [workflow]);
  const workflows = [...new Set(runs.map((r) => r.workflow))].sort();

  const submit = (event: FormEvent) => {
    event.preventDefault();
    onChange({ q: search.trim(), workflow: workflowText.trim() });
  };
  return (
    <form className="filters" role="search" onSubmit={submit}>
      <label>
        <span className="label">Search</span>
        <input type="search" value={search} placeholder="Name, workflow or person" onChange={(e) => setSearch(e.target.value)} />
      </label>
      <label>
        <span className="label">Status</span>
        <select value={status} onChange={(e) => onChange({ status: e.target.value })}>
          <option value="">Any status</option>
          {STATUSES.map((s) => (
            <option key={s} value={s}>
              {s}
            </option>
          ))}
        </select>
      </label>
      <label>
        <span className="label">Workflow</span>
        <input list="workflow-options" value={workflowText} placeholder="Any workflow" onChange={(e) => setWorkflowText(e.target.value)} />
        <datalist id="workflow-options">
          {workflows.map((w) => (
            <option key={w} value={w} />
          ))}
        </datalist>
      </label>
      <button type="submit" className="btn">
        Apply
      </button>
      {tag ? (
        <span className="filter-chip">
          tag: {tag}
          <button type="button" className="btn btn-small btn-ghost" aria-label={`Remove tag filter ${tag}`} onClick={() => onChange({ tag: "" })}>
            ×
          </button>
        </span>
      ) : null}
    </form>
  );
}

/** The cursor of a `next` link ("" when it has none). */
export function cursorOf(link: string): string {
  return new URL(link, window.location.origin).searchParams.get("cursor") ?? "";
}

function Pagination({
  page,
  shown,
  count,
  estimated,
  onNewer,
  onOlder,
}: {
  page: number | null; // null: reached by a cursor in the URL, its number unknown
  shown: number;
  count: number;
  estimated: boolean;
  onNewer: (() => void) | null;
  onOlder: (() => void) | null;
}) {
  const total = `${estimated ? "about " : ""}${count.toLocaleString("en-US")}`;
  const first = page === null ? null : (page - 1) * PAGE_SIZE + 1;
  return (
    <nav className="pagination" aria-label="Pages of runs">
      <span className="muted">
        {first === null ? `${shown} runs` : `${first}–${first + shown - 1}`} of {total}
      </span>
      <button type="button" className="btn btn-small" disabled={!onNewer} onClick={() => onNewer?.()}>
        Previous
      </button>
      {page === null ? null : <span>Page {page}</span>}
      <button type="button" className="btn btn-small" disabled={!onOlder} onClick={() => onOlder?.()}>
        Next
      </button>
    </nav>
  );
}

/** The first thing a new user sees: the commands that install the CLI and make a run. */
function GettingStarted() {
  const { slug } = useWorkspace();
  const commands = [
    cliInstallCommand(window.location.origin),
    `export TRAINYARD_URL=${window.location.origin}`,
    "export TRAINYARD_TOKEN=<make one on the API tokens page>",
    "trainyard run hello",
  ];
  return (
    <section className="empty getting-started" aria-labelledby="getting-started">
      <h2 id="getting-started">Start your first run</h2>
      <p>
        No runs in this workspace yet. Install the CLI (Python 3.11 or newer), then, from a repository with a{" "}
        <code>.trainyard/workflows.yaml</code>, run the others. Make the
        token on the <Link to={`/w/${slug}/tokens`}>API tokens</Link> page.
      </p>
      <ol className="commands">
        {commands.map((command) => (
          <li key={command}>
            <code>{command}</code>
            <CopyButton value={command} />
          </li>
        ))}
      </ol>
      <p className="muted">The run appears here as soon as it is submitted, and its logs stream live.</p>
    </section>
  );
}

function matches(run: Run, status: string, workflow: string, tag: string): boolean {
  if (status && run.status !== status) return false;
  if (workflow && run.workflow !== workflow) return false;
  if (tag && !(run.tags ?? []).includes(tag)) return false;
  return true;
}
