import { useState, type FormEvent } from "react";
import { del, get, post, wsPath } from "../api/client";
import type { AwsSetup, Backend } from "../api/types";
import { ACTIONS_COLUMN, DataTable } from "../components/DataTable";
import { ConfirmButton, CopyButton, EmptyState, ErrorBanner, Notice, PageHeader, StatusBadge, Time } from "../components/ui";
import { useApiList, useResource } from "../lib/hooks";
import { useWorkspace } from "../workspace";

/** Cloud accounts of the workspace: connect (role or keys), health, validate, remove. */
export function BackendsPage() {
  const { slug, isAdmin } = useWorkspace();
  const backends = useApiList<Backend>(slug, () => get<Backend[]>(wsPath(slug, "backends/")));
  const [done, setDone] = useState<string | null>(null);

  const validate = (name: string) =>
    backends.act(async () => {
      setDone(null);
      await post(wsPath(slug, `backends/${encodeURIComponent(name)}/validate/`));
      setDone(`Backend ${name} passed every check.`);
    });
  const remove = (name: string) => backends.act(() => del(wsPath(slug, `backends/${encodeURIComponent(name)}/`)));

  return (
    <>
      <PageHeader title="Backends" />
      <p className="lede">Cloud accounts this workspace starts machines in. Credentials are write-only: they never come back here.</p>
      <ErrorBanner error={backends.error ?? backends.actionError} />
      {done ? <Notice>{done}</Notice> : null}
      <DataTable
        rows={backends.data}
        error={backends.error}
        empty={<EmptyState title="No backends connected" />}
        columns={["Name", "Status", "Auth", "Regions", "Bucket", { label: "Live", className: "num" }, "Validated", isAdmin && ACTIONS_COLUMN]}
        renderRow={(backend) => (
          <tr key={backend.id}>
            <td>
              <span className="mono">{backend.name}</span> <span className="muted small">{backend.kind}</span>
              {backend.aws_account_id ? <div className="small muted">AWS account {backend.aws_account_id}</div> : null}
              {backend.kubernetes ? (
                <div className="small muted">
                  namespace {backend.kubernetes.namespace}, {backend.kubernetes.nodes} node(s)
                </div>
              ) : null}
            </td>
            <td>
              <StatusBadge status={backend.status} />
              {backend.status_reason ? <div className="small muted">{backend.status_reason}</div> : null}
            </td>
            <td>{backend.auth === "role" ? <span className="mono small">{backend.role_arn}</span> : backend.auth || "—"}</td>
            <td>{backend.regions.join(", ") || "—"}</td>
            <td className="mono">{backend.bucket || "—"}</td>
            <td className="num">{backend.live_instances}</td>
            <td>
              <Time iso={backend.validated_at} />
            </td>
            {isAdmin ? (
              <td className="actions">
                {backend.kind === "aws" || backend.kind === "kubernetes" ? (
                  <button type="button" className="btn btn-small" onClick={() => void validate(backend.name)}>
                    Validate
                  </button>
                ) : null}
                {backend.kind !== "local" ? (
                  <ConfirmButton label="Remove" confirmLabel={`Remove backend ${backend.name}`} onConfirm={() => remove(backend.name)} />
                ) : null}
              </td>
            ) : null}
          </tr>
        )}
      />
      {isAdmin ? <ConnectAws slug={slug} onConnected={(name) => void backends.reload().then(() => setDone(`Connected backend ${name}.`))} /> : null}
    </>
  );
}

type Way = "role" | "keys";

export function ConnectAws({ slug, onConnected }: { slug: string; onConnected: (name: string) => void }) {
  const [way, setWay] = useState<Way>("role");
  const [name, setName] = useState("aws");
  const [regions, setRegions] = useState("us-east-1");
  const [bucket, setBucket] = useState("");
  const [roleArn, setRoleArn] = useState("");
  const [keyId, setKeyId] = useState("");
  const [secret, setSecret] = useState("");
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);
  const setup = useResource<AwsSetup>(`${slug}/setup/${bucket}`, () => get<AwsSetup>(wsPath(slug, "backends/aws/setup/"), { bucket }));

  const submit = async (event: FormEvent) => {
    event.preventDefault();
    setError(null);
    setBusy(true);
    const body: Record<string, unknown> = {
      kind: "aws",
      name,
      bucket,
      regions: regions.split(",").map((r) => r.trim()).filter(Boolean),
    };
    if (way === "role") body.role_arn = roleArn;
    else Object.assign(body, { access_key_id: keyId, secret_access_key: secret });
    try {
      await post(wsPath(slug, "backends/"), body);
      setSecret("");
      onConnected(name);
    } catch (caught) {
      setError(caught instanceof Error ? caught.message : String(caught));
    } finally {
      setBusy(false);
    }
  };

  return (
    <section className="card" aria-label="Connect AWS">
      <h2>Connect AWS</h2>
      <div role="radiogroup" aria-label="How to connect">
        <label className="checkbox">
          <input type="radio" name="way" checked={way === "role"} onChange={() => setWay("role")} /> A role (recommended)
        </label>
        <label className="checkbox">
          <input type="radio" name="way" checked={way === "keys"} onChange={() => setWay("keys")} /> Access keys
        </label>
      </div>
      {way === "role" && setup.data ? (
        <div className="setup">
          <p>
            External id of this workspace: <code>{setup.data.external_id}</code> <CopyButton value={setup.data.external_id} />
          </p>
          <p className="small muted">
            The role must trust {setup.data.principal ? <code>{setup.data.principal}</code> : "the server's principal (TRAINYARD_AWS_PRINCIPAL_ARN)"} with
            this external id, and carry the permission policy below (deploy/aws/role.yaml creates both).
          </p>
          <details>
            <summary>Trust policy</summary>
            <pre aria-label="Trust policy">{JSON.stringify(setup.data.trust_policy, null, 2)}</pre>
          </details>
          <details>
            <summary>Permission policy</summary>
            <pre aria-label="Permission policy">{JSON.stringify(setup.data.permission_policy, null, 2)}</pre>
          </details>
        </div>
      ) : null}
      <ErrorBanner error={error ?? setup.error} />
      <form className="inline-form" onSubmit={submit} aria-label="Connect an AWS account">
        <label>
          Name
          <input value={name} onChange={(e) => setName(e.target.value)} required spellCheck={false} />
        </label>
        <label>
          Regions
          <input value={regions} onChange={(e) => setRegions(e.target.value)} placeholder="us-east-1,eu-west-1" required spellCheck={false} />
        </label>
        <label>
          Bucket
          <input value={bucket} onChange={(e) => setBucket(e.target.value)} placeholder="my-artifacts" required spellCheck={false} />
        </label>
        {way === "role" ? (
          <label>
            Role ARN
            <input value={roleArn} onChange={(e) => setRoleArn(e.target.value)} placeholder="arn:aws:iam::123456789012:role/trainyard" required spellCheck={false} />
          </label>
        ) : (
          <>
            <label>
              Access key id
              <input value={keyId} onChange={(e) => setKeyId(e.target.value)} required autoComplete="off" spellCheck={false} />
            </label>
            <label>
              Secret access key
              <input type="password" value={secret} onChange={(e) => setSecret(e.target.value)} required autoComplete="new-password" />
            </label>
          </>
        )}
        <button type="submit" className="btn btn-primary" disabled={busy}>
          {busy ? "Checking…" : "Connect"}
        </button>
      </form>
    </section>
  );
}
