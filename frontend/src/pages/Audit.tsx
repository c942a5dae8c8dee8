import { useCallback, useEffect, useState } from "react";
import { errorMessage, get, wsPath } from "../api/client";
import type { AuditEvent, AuditKind, AuditPage } from "../api/types";
import { DataTable } from "../components/DataTable";
import { EmptyState, ErrorBanner, PageHeader, Time } from "../components/ui";
import { useWorkspace } from "../workspace";

const KINDS: AuditKind[] = ["secret", "credential", "member", "backend", "token", "runner", "ssh_key", "workspace"];

/** The workspace's audit log (admins only): who changed secrets, credentials, members, backends, tokens and runners. */
export function AuditPage() {
  const { slug, isAdmin } = useWorkspace();
  const [kind, setKind] = useState<AuditKind | "">("");
  const [events, setEvents] = useState<AuditEvent[] | undefined>(undefined);
  const [cursor, setCursor] = useState<string | null>(null);
  const [error, setError] = useState<string | null>(null);

  const load = useCallback(
    async (after: string | null) => {
      try {
        const page = await get<AuditPage>(wsPath(slug, "audit/"), { kind: kind || undefined, cursor: after ?? undefined });
        setEvents((previous) => (after ? [...(previous ?? []), ...page.results] : page.results));
        setCursor(page.next ? new URL(page.next, window.location.origin).searchParams.get("cursor") : null);
        setError(null);
      } catch (caught) {
        setError(errorMessage(caught));
      }
    },
    [slug, kind],
  );

  useEffect(() => {
    setEvents(undefined);
    if (isAdmin) void load(null);
  }, [load, isAdmin]);

  if (!isAdmin) {
    return (
      <>
        <PageHeader title="Audit log" />
        <p className="lede">Only the workspace's admins read its audit log.</p>
      </>
    );
  }
  return (
    <>
      <PageHeader title="Audit log" />
      <p className="lede">Who changed this workspace's secrets, credentials, members, backends, tokens, runners and settings (its default guards), when, and from which address.</p>
      <label className="inline-form">
        Kind
        <select value={kind} onChange={(event) => setKind(event.target.value as AuditKind | "")} aria-label="Kind">
          <option value="">all</option>
          {KINDS.map((k) => (
            <option key={k} value={k}>
              {k}
            </option>
          ))}
        </select>
      </label>
      <ErrorBanner error={error} />
      <DataTable
        rows={events}
        error={error}
        empty={<EmptyState title="Nothing recorded yet" />}
        columns={["When", "Who", "Action", "Target", "From"]}
        renderRow={(event) => (
          <tr key={event.id}>
            <td>
              <Time iso={event.at} />
            </td>
            <td>{event.actor === "runner" ? `runner ${event.runner}` : event.username || "—"}</td>
            <td className="mono">{event.action}</td>
            <td className="mono">{event.target || "—"}</td>
            <td className="mono">{event.address ?? "—"}</td>
          </tr>
        )}
      />
      {cursor ? (
        <button type="button" className="btn" onClick={() => void load(cursor)}>
          Older events
        </button>
      ) : null}
    </>
  );
}
