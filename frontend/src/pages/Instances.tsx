import { useState } from "react";
import { Link } from "react-router-dom";
import { get, post, wsPath } from "../api/client";
import type { Instance } from "../api/types";
import { ACTIONS_COLUMN, DataTable } from "../components/DataTable";
import { ConfirmButton, EmptyState, ErrorBanner, Notice, PageHeader, StatusBadge, Time } from "../components/ui";
import { humanBytes, humanDuration } from "../lib/format";
import { useApiList, useInterval } from "../lib/hooks";
import { useWorkspace } from "../workspace";

/** Machines an admin may terminate here: live cloud or local ones (a self-hosted one is revoked on its own page). */
const TERMINABLE = new Set(["provisioning", "idle", "busy", "unreachable"]);

export function InstancesPage() {
  const { slug, isAdmin } = useWorkspace();
  const [all, setAll] = useState(false);
  const [notice, setNotice] = useState<string | null>(null);
  const instances = useApiList<Instance>(`${slug}/${all}`, () => get<Instance[]>(wsPath(slug, "instances/"), { all: all ? 1 : "" }));
  useInterval(() => void instances.reload(), 10_000);

  const terminate = async (instance: Instance) => {
    instances.setActionError(null);
    setNotice(null);
    await instances.act(async () => {
      const ended = await post<Instance>(wsPath(slug, `instances/${encodeURIComponent(instance.name)}/terminate/`));
      setNotice(`${ended.name} is ${ended.status}: the backend is terminating it.`);
    });
  };

  return (
    <>
      <PageHeader title="Runners & instances">
        <label className="checkbox">
          <input type="checkbox" checked={all} onChange={(e) => setAll(e.target.checked)} /> Show terminated
        </label>
      </PageHeader>
      <ErrorBanner error={instances.error ?? instances.actionError} />
      {notice ? <Notice>{notice}</Notice> : null}
      <DataTable
        rows={instances.data}
        error={instances.error}
        empty={
          <EmptyState title="No runners online">
            <p className="muted">
              Runners start when runs need them (cloud backends), or connect with <code>trainyard-runner</code> on a machine of yours.
            </p>
          </EmptyState>
        }
        columns={[
          "State",
          "Name",
          "Backend",
          "Type",
          "Where",
          { label: "Price/h", className: "num" },
          "Host",
          "Resources",
          "Current job",
          { label: "Uptime", className: "num" },
          "Last heartbeat",
          isAdmin && ACTIONS_COLUMN,
        ]}
        renderRow={(instance) => (
          <tr key={instance.id}>
            <td>
              <StatusBadge status={instance.status} />
              {instance.status_reason ? <div className="small muted">{instance.status_reason}</div> : null}
              {instance.cloud_state ? (
                <div className="small muted" title="What the cloud said when last asked">
                  cloud: {instance.cloud_state.replace("_", " ")} · <Time iso={instance.cloud_checked_at} />
                </div>
              ) : null}
            </td>
            <td className="mono">{instance.name}</td>
            <td>
              {instance.account ?? instance.backend}
              {instance.backend_id ? <div className="small muted mono">{instance.backend_id}</div> : null}
            </td>
            <td className="mono">{instance.instance_type || "—"}</td>
            <td>
              {[instance.zone || instance.region, instance.spot ? "spot" : instance.region ? "on-demand" : ""].filter(Boolean).join(" · ") || "—"}
            </td>
            <td className="num">{instance.price_per_hour ? `$${instance.price_per_hour.toFixed(4)}` : "—"}</td>
            <td className="mono small">{[instance.hostname, instance.address].filter(Boolean).join(" · ") || "—"}</td>
            <td>{resources(instance)}</td>
            <td>
              {instance.current_job ? (
                <Link to={`/w/${slug}/runs/${instance.current_job.run}?job=${encodeURIComponent(instance.current_job.job_name)}`}>
                  {instance.current_job.run} / {instance.current_job.job_name}
                </Link>
              ) : (
                <span className="muted">idle</span>
              )}
            </td>
            <td className="num">{humanDuration(instance.uptime_seconds)}</td>
            <td>
              <Time iso={instance.last_heartbeat_at} />
            </td>
            {isAdmin ? (
              <td className="actions">
                {TERMINABLE.has(instance.status) && instance.backend !== "self-hosted" ? (
                  <ConfirmButton
                    label="Terminate"
                    confirmLabel={instance.current_job ? "Terminate, ending its job" : "Terminate now"}
                    onConfirm={() => terminate(instance)}
                  />
                ) : null}
              </td>
            ) : null}
          </tr>
        )}
      />
    </>
  );
}

function resources(instance: Instance): string {
  const parts = [
    instance.cpus ? `${instance.cpus} CPU` : null,
    instance.memory_bytes ? humanBytes(instance.memory_bytes) : null,
    gpuText(instance.gpus),
  ].filter(Boolean);
  return parts.length ? parts.join(", ") : "—";
}

/** `gpus` is a count, a list of GPUs ({name, memory}) or empty. */
function gpuText(gpus: unknown): string | null {
  if (!gpus) return null;
  if (typeof gpus === "number") return `${gpus} GPU`;
  if (Array.isArray(gpus)) {
    if (!gpus.length) return null;
    const first = gpus[0] as { name?: string } | string;
    const name = typeof first === "string" ? first : first?.name;
    return `${gpus.length}× ${name || "GPU"}`;
  }
  return null;
}
