import { lazy, Suspense, useCallback, useEffect, useMemo, useState, useSyncExternalStore, type FormEvent, type ReactNode } from "react";
import { Link, useNavigate, useParams, useSearchParams } from "react-router-dom";
import { ApiError, errorMessage, get, post, wsPath } from "../api/client";
import { useLiveFrames } from "../api/live";
import { ACTIVE_RUN_STATUSES, type Artifact, type Job, type Run, type RunRef, type Tag } from "../api/types";
import { ArtifactsBrowser } from "../components/ArtifactsBrowser";
import { JobDataFacts } from "../components/JobData";
import { JobGraph } from "../components/JobGraph";
import { JobPorts } from "../components/JobPorts";
import { LineagePanel } from "../components/Lineage";
import { RerunBadge } from "../components/RerunBadge";
import { AttemptsTable } from "../components/AttemptsTable";
import { LogViewer, type AttemptMark, type WindowedLog } from "../components/LogViewer";
import { ErrorBanner, Loading, StatusBadge, Time } from "../components/ui";
import { absoluteTime, codeLabel, elapsedSeconds, humanBytes, humanDuration, money } from "../lib/format";
import { attemptMarks } from "../lib/attempts";
import { hasStoredTerminals } from "../lib/terminalStore";
import { useNow, useResource } from "../lib/hooks";
import { LogWindowStore, type LogSource, type WindowPage } from "../lib/logwindow";
import { useWorkspace } from "../workspace";
import { Tags } from "./Runs";

// xterm is loaded with the Terminal tab, not with every page.
const TerminalPanel = lazy(() => import("../components/Terminal").then((module) => ({ default: module.TerminalPanel })));
// So is uPlot with the Metrics tab; the page fetches it once it is idle, so the tab opens without waiting for it.
const loadMetricsPanel = () => import("../components/MetricsPanel");
const MetricsPanel = lazy(() => loadMetricsPanel().then((module) => ({ default: module.MetricsPanel })));

type TabName = "logs" | "metrics" | "artifacts" | "lineage" | "terminal";
const TAB_LABELS: Record<TabName, string> = { logs: "Logs", metrics: "Metrics", artifacts: "Artifacts", lineage: "Lineage", terminal: "Terminal" };

export function RunPage() {
  const { slug } = useWorkspace();
  const { run: runName = "" } = useParams();
  const [params, setParams] = useSearchParams();
  const asked = params.get("tab");
  const tab: TabName = asked === "metrics" || asked === "artifacts" || asked === "lineage" || asked === "terminal" ? asked : "logs";
  // Once shown, the terminals stay mounted (hidden under the other tabs) so their shells live on;
  // after a reload, at once if the page had terminals, to reattach to them within the grace.
  const [terminalShown, setTerminalShown] = useState(() => hasStoredTerminals(slug, runName));
  useEffect(() => {
    const timer = setTimeout(() => void loadMetricsPanel().catch(() => undefined), 100);
    return () => clearTimeout(timer);
  }, []);
  useEffect(() => setTerminalShown((was) => was || tab === "terminal"), [tab]);
  const now = useNow(1_000);

  const runResource = useResource<Run>(`${slug}/${runName}`, () => get<Run>(wsPath(slug, `runs/${encodeURIComponent(runName)}/`)));
  const run = runResource.data;
  // Each job's log is a bounded window, read through the pages (docs/LOGS.md, "Windows and search").
  const store = useMemo(() => new LogWindowStore(apiLogSource(slug)), [slug, runName]);
  const version = useSyncExternalStore(store.subscribe, store.getVersion);
  useEffect(() => run?.jobs.forEach((job) => store.observe(job.id, job.last_seq)), [run, store]);

  // Follow the run until it is finished and every job's lines are known.
  const complete =
    run !== undefined &&
    !ACTIVE_RUN_STATUSES.includes(run.status) &&
    run.jobs.every((job) => store.window(job.id).total >= job.last_seq);
  const livePath = run && !complete ? `/ws/v1/workspaces/${slug}/runs/${run.id}/` : null;
  useLiveFrames(
    livePath,
    (frame) => {
      if (frame.type === "run") runResource.setData(frame.run);
      else store.append(frame.job, frame.lines);
    },
    () => resumeQuery(store, run?.jobs ?? []),
  );

  const selectedName = params.get("job") ?? (run ? defaultJob(run.jobs)?.name : undefined) ?? null;
  const selectedJob = run?.jobs.find((j) => j.name === selectedName) ?? null;

  // The Terminal tab: while the run is active, and afterwards while its terminals are still on the page.
  const tabs: TabName[] =
    run && (ACTIVE_RUN_STATUSES.includes(run.status) || terminalShown)
      ? ["logs", "metrics", "artifacts", "lineage", "terminal"]
      : ["logs", "metrics", "artifacts", "lineage"];

  const setParam = (name: string, value: string) => {
    const next = new URLSearchParams(params);
    next.set(name, value);
    setParams(next, { replace: true });
  };

  if (!run) {
    return runResource.error ? <ErrorBanner error={runResource.error} /> : <Loading />;
  }
  return (
    <div className="run-page">
      <RunHeader run={run} now={now} onChange={(r) => runResource.setData(r)} />
      <ErrorBanner error={runResource.error} />
      <section aria-label="Job graph" className="card">
        <JobGraph jobs={run.jobs} selected={selectedName} onSelect={(job) => setParam("job", job.name)} now={now} />
      </section>
      <div className="tabs" role="tablist" aria-label="Run views">
        {tabs.map((name) => (
          <TabButton key={name} name={name} tabs={tabs} current={tab} onSelect={(t) => setParam("tab", t)} />
        ))}
      </div>
      {tab !== "terminal" ? (
        <div role="tabpanel" id={`panel-${tab}`} aria-labelledby={`tab-${tab}`} className="tabpanel">
          {tab === "logs" && selectedJob ? (
            <JobLogs key={selectedJob.id} job={selectedJob} store={store} version={version} now={now} />
          ) : null}
          {tab === "logs" && !selectedJob ? <p className="muted">This run has no jobs.</p> : null}
          {tab === "metrics" ? (
            <Suspense fallback={<Loading label="Loading the charts…" />}>
              <MetricsPanel run={run} job={selectedJob} />
            </Suspense>
          ) : null}
          {tab === "artifacts" ? <RunArtifacts run={run} /> : null}
          {tab === "lineage" ? <LineagePanel workspace={slug} run={run.name} version={`${run.status}/${(run.tags ?? []).join(",")}`} /> : null}
        </div>
      ) : null}
      {terminalShown && tabs.includes("terminal") ? (
        <div role="tabpanel" id="panel-terminal" aria-labelledby="tab-terminal" className="tabpanel" hidden={tab !== "terminal"}>
          <Suspense fallback={<Loading label="Loading the terminal…" />}>
            <TerminalPanel run={run} job={selectedJob} shown={tab === "terminal"} />
          </Suspense>
        </div>
      ) : null}
    </div>
  );
}

function TabButton({ name, tabs, current, onSelect }: { name: TabName; tabs: TabName[]; current: TabName; onSelect: (name: TabName) => void }) {
  const selected = name === current;
  return (
    <button
      type="button"
      role="tab"
      id={`tab-${name}`}
      aria-selected={selected}
      aria-controls={`panel-${name}`}
      tabIndex={selected ? 0 : -1}
      className={`tab ${selected ? "tab-selected" : ""}`}
      onClick={() => onSelect(name)}
      onKeyDown={(event) => {
        if (event.key === "ArrowRight" || event.key === "ArrowLeft") {
          const step = event.key === "ArrowRight" ? 1 : -1;
          const other = tabs[(tabs.indexOf(name) + step + tabs.length) % tabs.length];
          onSelect(other);
          document.getElementById(`tab-${other}`)?.focus();
        }
      }}
    >
      {TAB_LABELS[name]}
    </button>
  );
}

function RunHeader({ run, now, onChange }: { run: Run; now: number; onChange: (run: Run) => void }) {
  const { slug, canWrite } = useWorkspace();
  const navigate = useNavigate();
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState<string | null>(null);
  const [tagging, setTagging] = useState(false);
  const active = ACTIVE_RUN_STATUSES.includes(run.status);

  const act = async (name: string, action: () => Promise<void>) => {
    setBusy(name);
    setError(null);
    try {
      await action();
    } catch (caught) {
      setError(errorMessage(caught));
    } finally {
      setBusy(null);
    }
  };
  const stop = () => act("stop", async () => onChange(await post<Run>(wsPath(slug, `runs/${run.id}/stop/`))));
  const rerun = () =>
    act("rerun", async () => {
      const created = await post<Run>(wsPath(slug, `runs/${run.id}/rerun/`));
      navigate(`/w/${slug}/runs/${created.name}`);
    });

  return (
    <header className="run-header">
      <div className="run-title">
        <nav aria-label="Breadcrumb" className="breadcrumb">
          <Link to={`/w/${slug}/runs`}>Runs</Link> /
        </nav>
        <h1>
          {run.name} <StatusBadge status={run.status} />
        </h1>
        <RerunBadge run={run} workspace={slug} />
        {run.status_reason ? <p className="status-reason">{run.status_reason}</p> : null}
        {run.help ? <p className="run-help muted">{run.help}</p> : null}
        <dl className="facts">
          <Fact label="Workflow">{run.workflow}</Fact>
          <Fact label="Code">
            <span className="mono" title={run.code?.commit}>
              {codeLabel(run.code)}
            </span>
          </Fact>
          <Fact label="By">{run.submitted_by || "—"}</Fact>
          <Fact label="Submitted">
            <Time iso={run.created_at} />
          </Fact>
          <Fact label="Duration">{humanDuration(run.duration_seconds ?? elapsedSeconds(run.started_at, run.finished_at, now))}</Fact>
          {run.exit_code !== null ? <Fact label="Exit code">{run.exit_code}</Fact> : null}
          <Fact label="Cost">
            <span title={run.cost == null ? "No attempt held a machine" : `USD ${run.cost}: every attempt of every job, interrupted ones included`}>
              {money(run.cost)}
              {run.cost != null && run.finished_at === null ? " so far" : ""}
            </span>
          </Fact>
          {run.no_cache ? <Fact label="Cache">off (--no-cache)</Fact> : null}
          {run.environment_build ? (
            <Fact label="Kind">
              <span title="trainyard env build: builds and stores the workflow's environment; no commands run">
                environment build
              </span>
            </Fact>
          ) : null}
          {run.tags && run.tags.length ? (
            <Fact label="Tags">
              <Tags tags={run.tags} workspace={slug} />
            </Fact>
          ) : null}
        </dl>
      </div>
      {canWrite ? (
        <div className="run-actions">
          {active ? (
            <button type="button" className="btn btn-danger" onClick={stop} disabled={busy !== null || run.status === "stopping"}>
              {busy === "stop" ? "Stopping…" : "Stop"}
            </button>
          ) : null}
          <button type="button" className="btn" onClick={rerun} disabled={busy !== null}>
            {busy === "rerun" ? "Starting…" : "Re-run"}
          </button>
          <button
            type="button"
            className="btn"
            onClick={() => setTagging(!tagging)}
            aria-expanded={tagging}
            disabled={run.status !== "succeeded"}
            title={run.status === "succeeded" ? "Name this run" : "Only a succeeded run can be tagged"}
          >
            Tag
          </button>
        </div>
      ) : null}
      <ErrorBanner error={error} />
      {tagging ? (
        <TagForm
          run={run}
          onDone={(tags) => {
            setTagging(false);
            if (tags) onChange({ ...run, tags });
          }}
        />
      ) : null}
    </header>
  );
}

function TagForm({ run, onDone }: { run: Run; onDone: (tags?: string[]) => void }) {
  const { slug } = useWorkspace();
  const [name, setName] = useState("");
  const [conflict, setConflict] = useState<string | null>(null);
  const [error, setError] = useState<string | null>(null);

  const save = async (force: boolean) => {
    setError(null);
    try {
      const tag = await post<Tag>(wsPath(slug, "tags/"), { name: name.trim(), run: run.id, force });
      onDone([...new Set([...(run.tags ?? []), tag.name])]);
    } catch (caught) {
      if (caught instanceof ApiError && caught.status === 409) setConflict(caught.message);
      else setError(errorMessage(caught));
    }
  };
  const submit = (event: FormEvent) => {
    event.preventDefault();
    void save(false);
  };
  return (
    <form className="inline-form" onSubmit={submit} aria-label="Tag this run">
      <label>
        Tag name
        <input value={name} onChange={(e) => (setName(e.target.value), setConflict(null))} required autoFocus placeholder="e.g. base-model" />
      </label>
      <button type="submit" className="btn btn-primary">
        Save tag
      </button>
      <button type="button" className="btn" onClick={() => onDone()}>
        Cancel
      </button>
      <ErrorBanner error={error} />
      {conflict ? (
        <div className="banner banner-warning" role="alert">
          {conflict}{" "}
          <button type="button" className="btn btn-small btn-danger-solid" onClick={() => void save(true)}>
            Move tag to {run.name}
          </button>
        </div>
      ) : null}
    </form>
  );
}

function JobLogs({ job, store, version, now }: { job: Job; store: LogWindowStore; version: number; now: number }) {
  const { slug } = useWorkspace();
  const log = useWindowedLog(store, job.id, version);
  const total = log.windowed.total;
  const attempts = useMemo(() => attemptMarks(job, total), [job, total]);

  const waiting = job.status === "pending" || job.status === "assigned";
  return (
    <div className="job-logs">
      <JobFacts job={job} now={now} />
      {job.cached_from ? (
        <SourceLog job={job} source={job.cached_from} store={store} version={version} />
      ) : (
        <>
          <ErrorBanner error={log.error} />
          <LogViewer
            lines={log.lines}
            version={version}
            attempts={attempts}
            windowed={log.windowed}
            label={`Logs of ${job.name}`}
            placeholder={waiting ? "Waiting for the job to start…" : log.loaded ? "No output." : "Loading the log…"}
            downloadUrl={rawLogUrl(slug, job.id, { download: 1 })}
            linkParams={{ job: job.name, tab: "logs" }}
          />
        </>
      )}
    </div>
  );
}

/** A job reused from the cache: its source job's log, under the header `trainyard logs` prints. */
function SourceLog({ job, source, store, version }: { job: Job; source: RunRef; store: LogWindowStore; version: number }) {
  const log = useWindowedLog(store, source.job, version);
  const header: AttemptMark = { attempt: 0, lineIndex: 0, label: `--- ${job.name}: reused from ${source.run} (cached) ---` };
  return (
    <>
      <ErrorBanner error={log.error} />
      <LogViewer
        lines={log.lines}
        version={version}
        attempts={[header]}
        windowed={log.windowed}
        label={`Logs of ${job.name} (from ${source.run})`}
        linkParams={{ job: job.name, tab: "logs" }}
        placeholder={log.loaded ? "No output." : "Loading the log of the run it was reused from…"}
      />
    </>
  );
}

/** A job's window in `store`, read from its tail as soon as it is shown. */
function useWindowedLog(store: LogWindowStore, job: string, version: number) {
  useEffect(() => store.need(job, 0, 0), [store, job]);
  const w = store.window(job);
  const onNeed = useCallback((first: number, last: number) => store.need(job, first, last), [store, job]);
  const search = useCallback(
    (text: string, fromSeq: number, direction: "next" | "prev") => store.search(job, text, fromSeq, direction),
    [store, job],
  );
  // `version` stands for the window, which changes in place.
  // eslint-disable-next-line react-hooks/exhaustive-deps
  const windowed: WindowedLog = useMemo(() => ({ total: w.total, onNeed, search }), [w.total, onNeed, search, version]);
  return { lines: w.lines, windowed, loaded: w.loaded, error: w.error };
}

function JobFacts({ job, now }: { job: Job; now: number }) {
  const { slug, canWrite } = useWorkspace();
  const { run: runName = "" } = useParams();
  const r = job.resources ?? ({} as Job["resources"]);
  const resources = [
    r.cpu ? `${r.cpu} CPU` : null,
    r.memory_bytes ? humanBytes(r.memory_bytes) : null,
    r.gpu_count ? `${r.gpu_count}× ${r.gpu_name || "GPU"}` : null,
  ].filter(Boolean);
  return (
    <section className="job-facts card" aria-label={`Job ${job.name}`}>
      <h2>
        {job.name} <StatusBadge status={job.status} />
      </h2>
      <dl className="facts">
        <Fact label="Attempt">{job.attempt}</Fact>
        <Fact label={job.finished_at ? "Ended because" : "Status"}>{job.status_reason || (job.finished_at ? job.status : "—")}</Fact>
        <Fact label="Exit code">{job.exit_code ?? "—"}</Fact>
        <Fact label="Resources">{resources.length ? resources.join(", ") : "any"}</Fact>
        <Fact label="Instance">{job.instance ?? "—"}</Fact>
        {job.ports && job.ports.length && (job.status === "running" || job.status === "assigned") ? (
          <Fact label="Ports">
            <JobPorts job={job} run={runName} workspace={slug} canOpen={canWrite} />
          </Fact>
        ) : null}
        {job.provider ? <Fact label="Provider">{job.provider}</Fact> : null}
        <Fact label="Started">{job.started_at ? <span title={absoluteTime(job.started_at)}>{absoluteTime(job.started_at)}</span> : "—"}</Fact>
        <Fact label="Duration">{humanDuration(elapsedSeconds(job.started_at, job.finished_at, now))}</Fact>
        {job.needs && job.needs.length ? <Fact label="Needs">{job.needs.join(", ")}</Fact> : null}
        {job.cached_from ? (
          <Fact label="Cache">
            reused from{" "}
            <Link to={`/w/${slug}/runs/${job.cached_from.run}`}>{job.cached_from.run}</Link> (cached)
          </Fact>
        ) : job.cache_decision ? (
          <Fact label="Cache">{job.cache_decision.text}</Fact>
        ) : null}
        {job.inputs && job.inputs.length ? (
          <Fact label="Inputs">
            <ul className="plain">
              {job.inputs.map((input) => (
                <li key={input.path}>
                  <span className="mono">{input.path}</span> ← <span className="mono">{input.from}</span>
                </li>
              ))}
            </ul>
          </Fact>
        ) : null}
        <JobDataFacts job={job} />
      </dl>
      <AttemptsTable
        attempts={job.attempts}
        now={now}
        lockUrl={(key) => wsPath(slug, `environments/${encodeURIComponent(key)}/lock`)}
      />
    </section>
  );
}

function RunArtifacts({ run }: { run: Run }) {
  const { slug } = useWorkspace();
  const artifacts = useResource<Artifact[]>(`${slug}/${run.id}/${run.status}`, () => get<Artifact[]>(wsPath(slug, `runs/${run.id}/artifacts/`)));
  if (artifacts.error) return <ErrorBanner error={artifacts.error} />;
  if (!artifacts.data) return <Loading />;
  return <ArtifactsBrowser workspace={slug} artifacts={artifacts.data} jobs={run.jobs} />;
}

function Fact({ label, children }: { label: string; children: ReactNode }) {
  return (
    <div className="fact">
      <dt>{label}</dt>
      <dd>{children}</dd>
    </div>
  );
}

/** Each job's lines from where its window needs them: older ones are read through the pages. */
function resumeQuery(store: LogWindowStore, jobs: Job[]): string {
  const params = new URLSearchParams({ after_seq: "0" });
  for (const job of jobs) params.append("job_after", `${job.id}:${store.resumeSeq(job.id)}`);
  return `?${params.toString()}`;
}

function defaultJob(jobs: Job[]): Job | undefined {
  return (
    jobs.find((j) => j.status === "running") ??
    jobs.find((j) => j.status === "failed") ??
    [...jobs].reverse().find((j) => j.started_at) ??
    jobs[0]
  );
}

// A search request reads at most the server's byte budget and says `partial`
// past it: the viewer asks again from where it stopped, one request at a
// time, at most this many times (1 GiB at the default 64 MiB, a whole log at its cap).
export const SEARCH_REQUESTS = 16;

interface SearchAnswer {
  seq: number | null;
  partial: boolean;
  searched_to: number | null;
}

/** A job's lines and searches through the REST API (GET …/logs/; docs/API.md, "Logs"; docs/LOGS.md, "Windows and search"). */
export function apiLogSource(workspace: string): LogSource {
  return {
    page: (job, query) => get<WindowPage>(wsPath(workspace, `jobs/${job}/logs/`), query),
    search: async (job, text, fromSeq, direction) => {
      let from = fromSeq;
      for (let asked = 0; asked < SEARCH_REQUESTS && from >= 1; asked += 1) {
        const found = await get<SearchAnswer>(wsPath(workspace, `jobs/${job}/logs/`), { search: text, from_seq: from, direction });
        if (found.seq !== null || !found.partial || found.searched_to === null) return found.seq;
        from = direction === "next" ? found.searched_to + 1 : found.searched_to - 1;
      }
      return null;
    },
  };
}

/** A job's log as plain text (GET …/logs/raw; docs/LOGS.md). */
export function rawLogUrl(workspace: string, job: string, params: Record<string, number> = {}): string {
  const query = new URLSearchParams(Object.entries(params).map(([k, v]) => [k, String(v)])).toString();
  return wsPath(workspace, `jobs/${job}/logs/raw`) + (query ? `?${query}` : "");
}
