import { useState } from "react";
import { del, get, post } from "../api/client";
import { ACTIONS_COLUMN, DataTable } from "../components/DataTable";
import { ConfirmButton, CopyButton, EmptyState, ErrorBanner, PageHeader, StatusBadge, Time } from "../components/ui";
import { humanBytes } from "../lib/format";
import { useApiList, useInterval } from "../lib/hooks";
import { runnerInstallCommand } from "../lib/install";
import { useWorkspace } from "../workspace";

/** A registered machine (GET …/runners/). */
export interface SelfHostedRunner {
  id: string;
  name: string;
  status: string;
  status_reason: string;
  revoked: boolean;
  hostname: string;
  runner_version: string;
  cpus: number;
  memory_bytes: number;
  gpus: { name?: string }[];
  connected_at: string | null;
  last_heartbeat_at: string | null;
}

/** A registration token (GET …/runners/registration-tokens/); `token` only in the create answer. */
export interface RegistrationToken {
  id: string;
  prefix: string;
  note: string;
  state: "unused" | "used" | "revoked" | "expired";
  created_at: string;
  expires_at: string;
  used_at: string | null;
  token?: string;
}

/** The command a machine registers with: what the "Add a machine" panel shows. */
export function registerCommand(serverUrl: string, token: string): string {
  return `trainyard-runner register --url ${serverUrl} --token ${token} --work-dir /var/lib/trainyard-runner`;
}

export function SelfHostedPage() {
  const { slug } = useWorkspace();
  const base = `/api/v1/workspaces/${slug}/runners/`;
  const runners = useApiList<SelfHostedRunner>(`${slug}/runners`, () => get<SelfHostedRunner[]>(base));
  const tokens = useApiList<RegistrationToken>(`${slug}/registration-tokens`, () =>
    get<RegistrationToken[]>(`${base}registration-tokens/`),
  );
  const [created, setCreated] = useState<RegistrationToken | null>(null);
  useInterval(() => void runners.reload(), 10_000);

  const addMachine = () =>
    tokens.act(async () => {
      setCreated(await post<RegistrationToken>(`${base}registration-tokens/`, { note: "" }));
    });
  const revoke = (id: string) => runners.act(() => post(`${base}${id}/revoke/`));
  const revokeToken = (id: string) => tokens.act(() => del(`${base}registration-tokens/${id}/`));

  return (
    <>
      <PageHeader title="Self-hosted runners">
        <button type="button" className="btn btn-primary" onClick={() => void addMachine()}>
          Add a machine
        </button>
      </PageHeader>
      <p className="lede">
        Your own machines, each running <code>trainyard-runner</code>. They take this workspace's jobs that fit their CPUs, memory and GPUs, and
        are never stopped by Trainyard.
      </p>
      <ErrorBanner error={runners.error ?? runners.actionError ?? tokens.actionError} />
      {created?.token ? (
        <section className="card token-once" aria-labelledby="add-machine" role="status">
          <h2 id="add-machine">Add a machine</h2>
          <p>On the machine (Python 3.11 or newer), install the runner:</p>
          <div className="token-value">
            <code data-testid="install-command">{runnerInstallCommand(window.location.origin)}</code>
            <CopyButton value={runnerInstallCommand(window.location.origin)} label="Copy install command" />
          </div>
          <p>Then register it (the token works once, for 7 days, and is shown only now):</p>
          <div className="token-value">
            <code data-testid="register-command">{registerCommand(window.location.origin, created.token)}</code>
            <CopyButton value={registerCommand(window.location.origin, created.token)} label="Copy command" />
          </div>
          <p>
            Then start it with <code>trainyard-runner --work-dir /var/lib/trainyard-runner</code>, or install <code>deploy/trainyard-runner.service</code>.
          </p>
          <button type="button" className="btn btn-small btn-ghost" onClick={() => setCreated(null)}>
            Done
          </button>
        </section>
      ) : null}
      <DataTable
        rows={runners.data}
        error={runners.error}
        empty={<EmptyState title="No machines registered yet">Use “Add a machine” to register one.</EmptyState>}
        columns={["State", "Name", "Host", "Resources", "Last heartbeat", ACTIONS_COLUMN]}
        renderRow={(runner) => (
          <tr key={runner.id}>
            <td>
              <StatusBadge status={runner.revoked ? "revoked" : runner.status} />
              {runner.status_reason ? <div className="small muted">{runner.status_reason}</div> : null}
            </td>
            <td className="mono">{runner.name}</td>
            <td className="mono small">{runner.hostname || "—"}</td>
            <td>{[runner.cpus ? `${runner.cpus} CPU` : null, runner.memory_bytes ? humanBytes(runner.memory_bytes) : null, runner.gpus.length ? `${runner.gpus.length}× ${runner.gpus[0].name ?? "GPU"}` : null].filter(Boolean).join(", ") || "—"}</td>
            <td>
              <Time iso={runner.last_heartbeat_at} />
            </td>
            <td className="actions">
              {runner.revoked ? null : <ConfirmButton label="Revoke" confirmLabel={`Revoke ${runner.name}`} onConfirm={() => revoke(runner.id)} />}
            </td>
          </tr>
        )}
      />
      <h2>Registration tokens</h2>
      <DataTable
        rows={tokens.data}
        error={tokens.error}
        empty={<EmptyState title="No registration tokens" />}
        columns={["Token", "State", "Created", "Expires", ACTIONS_COLUMN]}
        renderRow={(token) => (
          <tr key={token.id}>
            <td className="mono small">{token.prefix}…</td>
            <td>{token.state}</td>
            <td>
              <Time iso={token.created_at} />
            </td>
            <td>
              <Time iso={token.expires_at} />
            </td>
            <td className="actions">
              {token.state === "unused" ? <ConfirmButton label="Revoke" onConfirm={() => revokeToken(token.id)} /> : null}
            </td>
          </tr>
        )}
      />
    </>
  );
}
