import { Link, useSearchParams } from "react-router-dom";
import { get, wsPath } from "../api/client";
import type { Environment, EnvironmentDetail } from "../api/types";
import { DataTable } from "../components/DataTable";
import { EmptyState, ErrorBanner, Loading, PageHeader, Time } from "../components/ui";
import { humanBytes, humanDuration, shortHash } from "../lib/format";
import { useResource } from "../lib/hooks";
import { useWorkspace } from "../workspace";

/** The workspace's Python environments (docs/ENVIRONMENTS.md): one row each; `?key=` opens one. */
export function EnvironmentsPage() {
  const { slug } = useWorkspace();
  const [params, setParams] = useSearchParams();
  const selected = params.get("key");
  const environments = useResource<Environment[]>(slug, () => get<Environment[]>(wsPath(slug, "environments/")));
  const open = (key: string | null) => setParams(key ? { key } : {}, { replace: true });
  return (
    <>
      <PageHeader title="Environments" />
      <p className="lede">
        The Python environments jobs ran in, built once from a workflow&apos;s <code>python</code> and <code>requirements</code> and
        reused by every job that asks for the same thing.
      </p>
      <ErrorBanner error={environments.error} />
      <DataTable
        rows={environments.data}
        error={environments.error}
        empty={
          <EmptyState title="No environments yet">
            <p className="muted">
              A workflow with <code>requirements:</code> builds one the first time it runs.
            </p>
          </EmptyState>
        }
        columns={[
          "Environment",
          "Platform",
          { label: "Packages", className: "num" },
          { label: "Size", className: "num" },
          { label: "Build", className: "num" },
          { label: "Runs", className: "num" },
          "Stored",
          "Last used",
        ]}
        renderRow={(env) => (
          <tr key={env.key} data-environment={env.key} aria-current={env.key === selected ? "true" : undefined}>
            <td className="mono">
              <button type="button" className="btn btn-small btn-ghost mono" onClick={() => open(env.key === selected ? null : env.key)} aria-expanded={env.key === selected}>
                {shortHash(env.key)}
              </button>
            </td>
            <td className="small">{platformLabel(env.platform)}</td>
            <td className="num">{env.packages}</td>
            <td className="num">{humanBytes(env.size_bytes)}</td>
            <td className="num">{humanDuration(env.build_seconds)}</td>
            <td className="num">{env.runs}</td>
            <td>{env.stored ? "yes" : "no"}</td>
            <td>
              <Time iso={env.last_used_at} />
            </td>
          </tr>
        )}
      />
      {selected ? <EnvironmentDetails key={selected} envKey={selected} onClose={() => open(null)} /> : null}
    </>
  );
}

function EnvironmentDetails({ envKey, onClose }: { envKey: string; onClose: () => void }) {
  const { slug } = useWorkspace();
  const path = wsPath(slug, `environments/${encodeURIComponent(envKey)}/`);
  const detail = useResource<EnvironmentDetail>(`${slug}/${envKey}`, () => get<EnvironmentDetail>(path));
  const env = detail.data;
  return (
    <section className="card environment-detail" aria-label={`Environment ${shortHash(envKey)}`}>
      <header className="card-head">
        <h2 className="mono">{envKey}</h2>
        <button type="button" className="btn btn-small" onClick={onClose}>
          Close
        </button>
      </header>
      <ErrorBanner error={detail.error} />
      {!env ? (
        detail.error ? null : <Loading />
      ) : (
        <>
          <dl className="facts">
            <div className="fact">
              <dt>Platform</dt>
              <dd>{platformLabel(env.platform)}</dd>
            </div>
            <div className="fact">
              <dt>Built on</dt>
              <dd>{env.built_on || "—"}</dd>
            </div>
            <div className="fact">
              <dt>Built</dt>
              <dd>
                <Time iso={env.created_at} />
              </dd>
            </div>
            <div className="fact">
              <dt>Lock</dt>
              <dd>
                <a href={wsPath(slug, `environments/${encodeURIComponent(envKey)}/lock`)} download>
                  Download the lock
                </a>
              </dd>
            </div>
          </dl>
          <h3>Recent runs</h3>
          {env.recent_runs.length ? (
            <ul className="plain inline-list">
              {env.recent_runs.map((name) => (
                <li key={name}>
                  <Link to={`/w/${slug}/runs/${name}`}>{name}</Link>
                </li>
              ))}
            </ul>
          ) : (
            <p className="muted">No run used it yet.</p>
          )}
          <h3>Installed packages</h3>
          <pre className="code installed-packages" tabIndex={0} aria-label="Installed packages">
            {env.installed || "(none reported)"}
          </pre>
        </>
      )}
    </section>
  );
}

function platformLabel(platform: Record<string, string>): string {
  const parts = [platform.python ? `Python ${platform.python}` : null, platform.os, platform.machine];
  const shown = parts.filter(Boolean).join(", ");
  return shown || Object.entries(platform).map(([k, v]) => `${k} ${v}`).join(", ") || "—";
}
