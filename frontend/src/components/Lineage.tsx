// A run's lineage (GET …/runs/<run>/lineage/): the runs and tags that fed it,
// and the runs that used its artifacts, each with how they are linked.
import { Link } from "react-router-dom";
import { get, wsPath } from "../api/client";
import type { Lineage, LineageEdge, LineageRun } from "../api/types";
import { useResource } from "../lib/hooks";
import { ErrorBanner, Loading, StatusBadge, Time } from "./ui";

const HOW: Record<LineageEdge["kind"], string> = {
  tag: "tag",
  run: "run",
  workflow: "latest run of workflow",
  cache: "cached job",
};

export function LineagePanel({ workspace, run, version }: { workspace: string; run: string; version: string }) {
  const lineage = useResource<Lineage>(`${workspace}/${run}/${version}`, () =>
    get<Lineage>(wsPath(workspace, `runs/${encodeURIComponent(run)}/lineage/`)),
  );
  if (lineage.error) return <ErrorBanner error={lineage.error} />;
  const data = lineage.data;
  if (!data) return <Loading label="Reading the lineage…" />;
  const upstream = data.runs.filter((r) => r.distance < 0).sort((a, b) => b.distance - a.distance);
  const downstream = data.runs.filter((r) => r.distance > 0).sort((a, b) => a.distance - b.distance);
  return (
    <div className="lineage">
      <section className="card" aria-labelledby="lineage-upstream">
        <h2 id="lineage-upstream">Fed by</h2>
        <p className="muted small">Runs whose artifacts this run read (its <code>deps</code>), and the runs those read, up to {data.depth} steps.</p>
        <LineageList workspace={workspace} runs={upstream} edges={data.edges} side="upstream" empty="Nothing: this run read no other run's artifacts." />
      </section>
      <section className="card" aria-labelledby="lineage-downstream">
        <h2 id="lineage-downstream">Used by</h2>
        <p className="muted small">Runs that read this run&apos;s artifacts, and the runs that read theirs.</p>
        <LineageList workspace={workspace} runs={downstream} edges={data.edges} side="downstream" empty="No run has used its artifacts yet." />
      </section>
      {data.truncated ? <p className="muted">More runs lie further away than shown.</p> : null}
    </div>
  );
}

function LineageList({
  workspace,
  runs,
  edges,
  side,
  empty,
}: {
  workspace: string;
  runs: LineageRun[];
  edges: LineageEdge[];
  side: "upstream" | "downstream";
  empty: string;
}) {
  if (!runs.length) return <p className="muted">{empty}</p>;
  return (
    <ul className="plain lineage-list">
      {runs.map((r) => {
        // Upstream: how this run fed the next one down the chain; downstream: how it read the one before.
        const links = edges.filter((e) => (side === "upstream" ? e.producer === r.name : e.consumer === r.name));
        return (
          <li key={r.name} className="lineage-run" data-run={r.name} data-distance={r.distance}>
            <div className="lineage-head">
              <Link to={`/w/${workspace}/runs/${r.name}`}>{r.name}</Link> <StatusBadge status={r.status} />
              <span className="muted small">
                {r.workflow}
                {r.submitted_by ? ` · ${r.submitted_by}` : ""} · <Time iso={r.created_at} />
              </span>
              {r.tags.length ? (
                <span className="tags">
                  {r.tags.map((t) => (
                    <span key={t} className="tag">
                      {t}
                    </span>
                  ))}
                </span>
              ) : null}
            </div>
            <ul className="plain lineage-edges">
              {links.map((e) => (
                <li key={`${e.producer}-${e.consumer}-${e.kind}-${e.name}-${e.job}`} data-kind={e.kind}>
                  {side === "upstream" ? (
                    <>
                      → <Link to={`/w/${workspace}/runs/${e.consumer}`}>{e.consumer}</Link>&apos;s job <span className="mono">{e.job}</span> read it as{" "}
                      {HOW[e.kind]} <span className="mono">{e.name}</span>
                    </>
                  ) : (
                    <>
                      ← its job <span className="mono">{e.job}</span> read <Link to={`/w/${workspace}/runs/${e.producer}`}>{e.producer}</Link> as {HOW[e.kind]}{" "}
                      <span className="mono">{e.name}</span>
                    </>
                  )}
                </li>
              ))}
            </ul>
          </li>
        );
      })}
    </ul>
  );
}
