import { Link } from "react-router-dom";
import { get, wsPath } from "../api/client";
import type { Volume } from "../api/types";
import { DataTable } from "../components/DataTable";
import { EmptyState, ErrorBanner, PageHeader, Time } from "../components/ui";
import { humanBytes } from "../lib/format";
import { useApiList } from "../lib/hooks";
import { useWorkspace } from "../workspace";

/** Where a volume lives: its zone (aws), the machine it is a folder of (self-hosted), else its region. */
function where(volume: Volume): string {
  if (volume.backend === "self-hosted") return volume.machine ?? "—";
  return volume.zone || volume.region || "—";
}

export function VolumesPage() {
  const { slug } = useWorkspace();
  const volumes = useApiList<Volume>(slug, () => get<Volume[]>(wsPath(slug, "volumes/")));
  return (
    <>
      <PageHeader title="Volumes" />
      <p className="lede">
        Persistent volumes outlive runs and machines. A job mounts one with <code>volumes: [NAME:/path]</code> and runs
        where it is; one job at a time.
      </p>
      <ErrorBanner error={volumes.error} />
      <DataTable
        rows={volumes.data}
        error={volumes.error}
        empty={
          <EmptyState title="No volumes yet">
            <p className="muted">
              Create one with <code>trainyard volume create NAME --size 100GB --backend aws --region us-east-1</code>.
            </p>
          </EmptyState>
        }
        columns={["Volume", "Backend", "Where", "Size", "Status", "Attached to", "Created"]}
        renderRow={(volume) => (
          <tr key={volume.id}>
            <td>{volume.name}</td>
            <td>{volume.backend}</td>
            <td>{where(volume)}</td>
            <td>{humanBytes(volume.size_bytes)}</td>
            <td title={volume.status_reason || undefined}>{volume.status}</td>
            <td>
              {volume.attached_to ? (
                <>
                  <Link to={`/w/${slug}/runs/${volume.attached_to.run}`}>{volume.attached_to.run}</Link> /{" "}
                  {volume.attached_to.job_name} ({volume.attached_to.job_status})
                </>
              ) : (
                "—"
              )}
              {volume.attached_machine ? <span className="muted"> on {volume.attached_machine}</span> : null}
            </td>
            <td>
              <Time iso={volume.created_at} />
            </td>
          </tr>
        )}
      />
    </>
  );
}
