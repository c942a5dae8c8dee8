import { useMemo, useState, type FormEvent } from "react";
import { Link, useNavigate } from "react-router-dom";
import { ApiError, errorMessage, get, post, wsPath } from "../api/client";
import type { Run, RunSource } from "../api/types";
import { EmptyState, ErrorBanner, Loading, PageHeader, Time } from "../components/ui";
import { useResource } from "../lib/hooks";
import { useWorkspace } from "../workspace";

const ENV_NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

/**
 * Start a run from the browser: the code and workflows files of the last run
 * submitted from a repository, a workflow of those files, `-e` values and
 * resources; sent to the same API as `trainyard run` (docs/RUNS.md,
 * "Starting a run from the dashboard"), whose errors show on the form.
 */
export function NewRunPage() {
  const { slug, canWrite } = useWorkspace();
  const navigate = useNavigate();
  const sources = useResource<RunSource[]>(slug, () => get<RunSource[]>(wsPath(slug, "runs/sources/")));
  const [sourceIndex, setSourceIndex] = useState(0);
  const [workflow, setWorkflow] = useState("");
  const [env, setEnv] = useState("");
  const [gpu, setGpu] = useState("");
  const [cpu, setCpu] = useState("");
  const [memory, setMemory] = useState("");
  const [disk, setDisk] = useState("");
  const [noCache, setNoCache] = useState(false);
  const [error, setError] = useState<string | null>(null);
  const [details, setDetails] = useState<string[]>([]);
  const [busy, setBusy] = useState(false);

  const source = sources.data?.[sourceIndex];
  const chosen = useMemo(() => {
    const names = source?.workflows.map((w) => w.name) ?? [];
    return names.includes(workflow) ? workflow : (names[0] ?? "");
  }, [source, workflow]);
  const help = source?.workflows.find((w) => w.name === chosen)?.help;

  const submit = async (event: FormEvent) => {
    event.preventDefault();
    if (!source) return;
    setError(null);
    setDetails([]);
    const parsed = parseEnv(env);
    if (typeof parsed === "string") {
      setError(parsed);
      return;
    }
    const resources: Record<string, string | number> = {};
    if (gpu.trim()) resources.gpu = gpu.trim();
    if (cpu.trim()) resources.cpu = Number(cpu);
    if (memory.trim()) resources.memory = memory.trim();
    if (disk.trim()) resources.disk = disk.trim();
    setBusy(true);
    try {
      const run = await post<Run>(wsPath(slug, "runs/"), {
        workflow: chosen,
        workflows_files: source.workflows_files,
        code: source.code,
        environment_files: source.environment_files,
        env: parsed,
        resources,
        no_cache: noCache,
      });
      navigate(`/w/${slug}/runs/${run.name}`);
    } catch (caught) {
      setError(errorMessage(caught));
      setDetails(caught instanceof ApiError ? fieldErrors(caught.extra) : []);
    } finally {
      setBusy(false);
    }
  };

  if (!canWrite) {
    return (
      <>
        <PageHeader title="New run" />
        <p className="muted">Viewers cannot start runs: ask a workspace admin for the member role.</p>
      </>
    );
  }
  return (
    <>
      <nav aria-label="Breadcrumb" className="breadcrumb">
        <Link to={`/w/${slug}/runs`}>Runs</Link> /
      </nav>
      <PageHeader title="New run" />
      <p className="lede">
        Runs a workflow from the code and workflows files of the last run submitted from a repository, as <code>trainyard run</code> would with
        the same checkout.
      </p>
      <ErrorBanner error={sources.error} />
      {!sources.data ? (
        sources.error ? null : <Loading />
      ) : !source ? (
        <EmptyState title="Nothing to start from yet">
          <p className="muted">
            Submit a first run with <code>trainyard run</code>: its repository and workflows appear here.
          </p>
        </EmptyState>
      ) : (
        <form className="form-stack card new-run" onSubmit={submit} aria-label="New run">
          <label>
            Repository
            <select value={sourceIndex} onChange={(e) => (setSourceIndex(Number(e.target.value)), setWorkflow(""))}>
              {sources.data.map((s, i) => (
                <option key={`${s.repo}-${s.run}`} value={i}>
                  {s.repo}
                </option>
              ))}
            </select>
          </label>
          <p className="muted small source-note">
            Code and workflows files of run <Link to={`/w/${slug}/runs/${source.run}`}>{source.run}</Link>
            {source.code.commit ? (
              <>
                {" "}
                at commit <span className="mono">{source.code.commit.slice(0, 12)}</span>
                {source.code.patch_blob ? " with its uncommitted changes" : ""}
              </>
            ) : null}
            , submitted by {source.submitted_by || "—"} <Time iso={source.submitted_at} />.
          </p>
          <label>
            Workflow
            {source.workflows.length ? (
              <select value={chosen} onChange={(e) => setWorkflow(e.target.value)}>
                {source.workflows.map((w) => (
                  <option key={w.name} value={w.name}>
                    {w.name} ({w.provider})
                  </option>
                ))}
              </select>
            ) : (
              <span className="muted">Its workflows files no longer parse: submit from the CLI.</span>
            )}
          </label>
          {help ? <p className="muted small">{help}</p> : null}
          <label>
            Environment variables
            <textarea
              value={env}
              onChange={(e) => setEnv(e.target.value)}
              rows={3}
              placeholder={"LR=0.01\nEPOCHS=3"}
              spellCheck={false}
              aria-describedby="env-help"
            />
          </label>
          <p id="env-help" className="muted small">
            One <code>NAME=value</code> a line, as <code>trainyard run -e</code>: they win over the workflow&apos;s <code>env</code>.
          </p>
          <fieldset className="resources">
            <legend>Resources (every job; empty keeps the workflow&apos;s)</legend>
            <label>
              GPU
              <input value={gpu} onChange={(e) => setGpu(e.target.value)} placeholder="A10G:1, 2 or none" spellCheck={false} />
            </label>
            <label>
              CPUs
              <input type="number" min={1} value={cpu} onChange={(e) => setCpu(e.target.value)} placeholder="4" />
            </label>
            <label>
              Memory
              <input value={memory} onChange={(e) => setMemory(e.target.value)} placeholder="16GB" spellCheck={false} />
            </label>
            <label>
              Disk
              <input value={disk} onChange={(e) => setDisk(e.target.value)} placeholder="100GB" spellCheck={false} />
            </label>
          </fieldset>
          <label className="checkbox">
            <input type="checkbox" checked={noCache} onChange={(e) => setNoCache(e.target.checked)} /> Run every job again (no cache)
          </label>
          <ErrorBanner error={error} />
          {details.length ? (
            <ul className="form-errors">
              {details.map((d) => (
                <li key={d}>{d}</li>
              ))}
            </ul>
          ) : null}
          <div>
            <button type="submit" className="btn btn-primary" disabled={busy || !chosen}>
              {busy ? "Starting…" : "Start run"}
            </button>
          </div>
        </form>
      )}
    </>
  );
}

/** `-e` lines as a mapping, or the message naming the first bad line. */
export function parseEnv(text: string): Record<string, string> | string {
  const env: Record<string, string> = {};
  const lines = text.split("\n");
  for (let i = 0; i < lines.length; i += 1) {
    const line = lines[i].trim();
    if (!line) continue;
    const eq = line.indexOf("=");
    const name = eq < 0 ? line : line.slice(0, eq);
    if (eq < 0 || !ENV_NAME.test(name)) {
      return `Environment variables, line ${i + 1}: "${line}" is not NAME=value (a name is letters, digits and underscores, not starting with a digit).`;
    }
    env[name] = line.slice(eq + 1);
  }
  return env;
}

/** A validation error's fields as "field: message" lines. */
function fieldErrors(extra: Record<string, unknown>): string[] {
  const fields = extra.fields;
  if (!fields || typeof fields !== "object") return [];
  const out: string[] = [];
  const walk = (prefix: string, value: unknown) => {
    if (Array.isArray(value)) value.forEach((v) => (typeof v === "string" ? out.push(`${prefix}: ${v}`) : walk(prefix, v)));
    else if (value && typeof value === "object") Object.entries(value).forEach(([k, v]) => walk(prefix ? `${prefix}.${k}` : k, v));
    else if (value !== undefined) out.push(`${prefix}: ${String(value)}`);
  };
  walk("", fields);
  return out;
}
