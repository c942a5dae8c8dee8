import { useEffect, useState } from "react";
import { Link } from "react-router-dom";
import { get, post, wsPath } from "../api/client";
import type { AccessSession } from "../api/types";
import { useAuth } from "../auth";
import { ACTIONS_COLUMN, DataTable } from "../components/DataTable";
import { ConfirmButton, EmptyState, ErrorBanner, PageHeader, StatusBadge, Time } from "../components/ui";
import { humanBytes } from "../lib/format";
import { useApiList, useInterval } from "../lib/hooks";
import { useWorkspace } from "../workspace";

const REFRESH_MS = 3_000;
const APP_PROXY = "app proxy"; // the client label of the apps proxy's connections

/**
 * Sessions into running jobs (docs/ACCESS.md, "Audit and limits"): an admin
 * sees and may end everyone's, a member their own; viewers open none.
 */
export function SessionsPage() {
  const { slug, canWrite, isAdmin } = useWorkspace();
  const { me } = useAuth();
  const [showEnded, setShowEnded] = useState(false);
  // Sessions ended from this page stay in the live list, marked ended, until the page is left.
  const [endedHere, setEndedHere] = useState<AccessSession[]>([]);
  useEffect(() => setEndedHere([]), [slug]);
  const sessions = useApiList<AccessSession>(canWrite ? `${slug}/${showEnded}` : null, () =>
    get<AccessSession[]>(wsPath(slug, "sessions/"), { live: showEnded ? "" : 1 }),
  );
  useInterval(() => void sessions.reload(), canWrite ? REFRESH_MS : null);

  if (!canWrite) {
    return (
      <>
        <PageHeader title="Sessions" />
        <p className="lede">Viewers cannot open sessions into jobs (shells, terminals, forwarded ports, apps), so there are none to list here.</p>
      </>
    );
  }

  const end = (session: AccessSession) =>
    sessions.act(async () => {
      sessions.setActionError(null);
      const ended = await post<AccessSession>(wsPath(slug, `sessions/${session.id}/end/`));
      setEndedHere((previous) => [...previous.filter((s) => s.id !== ended.id), ended]);
    });
  const rows = sessions.data ? withEndedHere(sessions.data, showEnded ? [] : endedHere) : undefined;
  const anyEnded = showEnded || (rows ?? []).some((s) => s.state === "ended");
  const mayEnd = (session: AccessSession) => session.state !== "ended" && (isAdmin || session.user === me?.username);

  return (
    <>
      <PageHeader title="Sessions">
        <label className="checkbox">
          <input type="checkbox" checked={showEnded} onChange={(e) => setShowEnded(e.target.checked)} /> Show ended
        </label>
      </PageHeader>
      <p className="lede">
        {isAdmin ? "Everyone's" : "Your"} {showEnded ? "sessions, live and ended," : "live sessions"} into this workspace's jobs: shells, terminals,
        forwarded ports and app connections. Ending one closes it at once, with a message to whoever holds it.
      </p>
      <ErrorBanner error={sessions.error ?? sessions.actionError} />
      <DataTable
        rows={rows}
        error={sessions.error}
        empty={
          <EmptyState title={showEnded ? "No sessions yet" : "No live sessions"}>
            <p className="muted">
              A session starts with <code>trainyard ssh</code>, <code>trainyard forward</code>, a run page's Terminal tab or a job's Open link.
            </p>
          </EmptyState>
        }
        columns={[
          "Who",
          "Run / job",
          { label: "Attempt", className: "num" },
          "Kind",
          "From",
          "Started",
          "State",
          { label: <abbr title="bytes to the client (↓) and to the job (↑)">Bytes ↓/↑</abbr>, className: "num" },
          anyEnded && "End reason",
          ACTIONS_COLUMN,
        ]}
        renderRow={(session) => (
          <tr key={session.id} data-session={session.id}>
            <td>{session.user}</td>
            <td>
              <Link to={`/w/${slug}/runs/${session.run}?job=${encodeURIComponent(session.job)}`}>
                {session.run} / {session.job}
              </Link>
            </td>
            <td className="num">{session.attempt}</td>
            <td>{kindLabel(session)}</td>
            <td>
              {session.client_label || "—"}
              {session.client_address ? <div className="small muted mono">{session.client_address}</div> : null}
            </td>
            <td className="nowrap">
              <Time iso={session.started_at ?? session.created_at} />
            </td>
            <td>
              <StatusBadge status={session.state} />
            </td>
            <td className="num mono small">
              <span title="to the client">↓ {humanBytes(session.bytes_down)}</span>
              <br />
              <span title="to the job">↑ {humanBytes(session.bytes_up)}</span>
            </td>
            {anyEnded ? <td className="small">{session.end_reason || (session.state === "ended" ? "—" : "")}</td> : null}
            <td className="actions">
              {mayEnd(session) ? (
                <ConfirmButton label="End" confirmLabel={`End ${session.user}'s ${kindLabel(session)} session`} onConfirm={() => end(session)} />
              ) : null}
            </td>
          </tr>
        )}
      />
    </>
  );
}

/** "ssh", "terminal", "port 8888", "app proxy (port 8888)". */
export function kindLabel(session: Pick<AccessSession, "kind" | "port" | "client_label">): string {
  if (session.kind !== "port") return session.kind;
  const port = session.port ? `port ${session.port}` : "port";
  return session.client_label === APP_PROXY ? `app proxy (${port})` : port;
}

/** The listed sessions, and those ended from this page that the live list no longer holds, newest first. */
function withEndedHere(listed: AccessSession[], endedHere: AccessSession[]): AccessSession[] {
  const ended = new Map(endedHere.map((s) => [s.id, s]));
  const rows = listed.map((s) => ended.get(s.id) ?? s);
  const shown = new Set(rows.map((s) => s.id));
  rows.push(...endedHere.filter((s) => !shown.has(s.id)));
  return rows.sort((a, b) => b.created_at.localeCompare(a.created_at));
}
