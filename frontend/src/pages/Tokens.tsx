import { useState, type FormEvent } from "react";
import { del, get, post } from "../api/client";
import type { ApiToken, CreatedToken } from "../api/types";
import { ACTIONS_COLUMN, DataTable } from "../components/DataTable";
import { ConfirmButton, CopyButton, EmptyState, ErrorBanner, PageHeader, Time } from "../components/ui";
import { useApiList } from "../lib/hooks";

export function TokensPage() {
  const tokens = useApiList<ApiToken>("tokens", () => get<ApiToken[]>("/api/v1/tokens/"));
  const [name, setName] = useState("");
  const [expiresIn, setExpiresIn] = useState("");
  const [created, setCreated] = useState<{ name: string; token: string } | null>(null);

  const create = async (event: FormEvent) => {
    event.preventDefault();
    tokens.setActionError(null);
    await tokens.act(async () => {
      const token = await post<CreatedToken>("/api/v1/tokens/", { name: name.trim(), expires_in: expiresIn });
      setCreated({ name: token.name, token: token.token });
      setName("");
    });
  };
  const revoke = (id: string) => tokens.act(() => del(`/api/v1/tokens/${id}/`));

  return (
    <>
      <PageHeader title="API tokens" />
      <p className="lede">
        Personal tokens for the <code>trainyard</code> CLI and the API (<code>export TRAINYARD_TOKEN=…</code>). A token acts as you in every workspace you belong to.
      </p>
      <ErrorBanner error={tokens.error ?? tokens.actionError} />
      <form className="inline-form card" onSubmit={create} aria-label="Create a token">
        <label>
          Token name
          <input value={name} onChange={(e) => setName(e.target.value)} placeholder="laptop" required autoComplete="off" />
        </label>
        <label>
          Expires
          <select value={expiresIn} onChange={(e) => setExpiresIn(e.target.value)}>
            <option value="">the server's default (90 days unless configured)</option>
            <option value="7d">in 7 days</option>
            <option value="30d">in 30 days</option>
            <option value="90d">in 90 days</option>
            <option value="365d">in 365 days</option>
            <option value="never">never</option>
          </select>
        </label>
        <button type="submit" className="btn btn-primary">
          Create token
        </button>
      </form>
      {created ? (
        <section className="card token-once" aria-labelledby="new-token" role="status">
          <h2 id="new-token">Token “{created.name}” created</h2>
          <p>Copy it now: it is shown only once.</p>
          <div className="token-value">
            <code data-testid="new-token">{created.token}</code>
            <CopyButton value={created.token} label="Copy token" />
          </div>
          <button type="button" className="btn btn-small btn-ghost" onClick={() => setCreated(null)}>
            Done
          </button>
        </section>
      ) : null}
      <DataTable
        rows={tokens.data}
        error={tokens.error}
        empty={<EmptyState title="No tokens yet" />}
        columns={["Name", "Token", "Created", "Last used", "Expires", ACTIONS_COLUMN]}
        renderRow={(token) => (
          <tr key={token.id}>
            <td>{token.name}</td>
            <td className="mono small">{token.prefix}…</td>
            <td>
              <Time iso={token.created_at} />
            </td>
            <td>{token.last_used_at ? <Time iso={token.last_used_at} /> : <span className="muted">never</span>}</td>
            <td>{token.expires_at ? <Time iso={token.expires_at} /> : <span className="muted">never</span>}</td>
            <td className="actions">
              <ConfirmButton label="Revoke" confirmLabel={`Revoke ${token.name}`} onConfirm={() => revoke(token.id)} />
            </td>
          </tr>
        )}
      />
    </>
  );
}
