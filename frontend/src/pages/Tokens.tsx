import { useState, type FormEvent } from "react";
import { del, errorMessage, get, post } from "../api/client";
import type { ApiToken, CreatedToken } from "../api/types";
import { ConfirmButton, CopyButton, EmptyState, ErrorBanner, Loading, PageHeader, Time } from "../components/ui";
import { useResource } from "../lib/hooks";

export function TokensPage() {
  const tokens = useResource<ApiToken[]>("tokens", () => get<ApiToken[]>("/api/v1/tokens/"));
  const [name, setName] = useState("");
  const [created, setCreated] = useState<{ name: string; token: string } | null>(null);
  const [error, setError] = useState<string | null>(null);

  const create = async (event: FormEvent) => {
    event.preventDefault();
    setError(null);
    try {
      const token = await post<CreatedToken>("/api/v1/tokens/", { name: name.trim() });
      setCreated({ name: token.name, token: token.token });
      setName("");
      await tokens.reload();
    } catch (caught) {
      setError(errorMessage(caught));
    }
  };
  const revoke = async (id: string) => {
    try {
      await del(`/api/v1/tokens/${id}/`);
      await tokens.reload();
    } catch (caught) {
      setError(errorMessage(caught));
    }
  };

  return (
    <>
      <PageHeader title="API tokens" />
      <p className="lede">
        Personal tokens for the <code>trainyard</code> CLI and the API (<code>export TRAINYARD_TOKEN=…</code>). A token acts as you in every workspace you belong to.
      </p>
      <ErrorBanner error={tokens.error ?? error} />
      <form className="inline-form card" onSubmit={create} aria-label="Create a token">
        <label>
          Token name
          <input value={name} onChange={(e) => setName(e.target.value)} placeholder="laptop" required autoComplete="off" />
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
      {!tokens.data && !tokens.error ? <Loading /> : null}
      {tokens.data && !tokens.data.length ? <EmptyState title="No tokens yet" /> : null}
      {tokens.data && tokens.data.length ? (
        <div className="table-wrap">
          <table className="table">
            <thead>
              <tr>
                <th scope="col">Name</th>
                <th scope="col">Token</th>
                <th scope="col">Created</th>
                <th scope="col">Last used</th>
                <th scope="col"><span className="visually-hidden">Actions</span></th>
              </tr>
            </thead>
            <tbody>
              {tokens.data.map((token) => (
                <tr key={token.id}>
                  <td>{token.name}</td>
                  <td className="mono small">{token.prefix}…</td>
                  <td>
                    <Time iso={token.created_at} />
                  </td>
                  <td>{token.last_used_at ? <Time iso={token.last_used_at} /> : <span className="muted">never</span>}</td>
                  <td className="actions">
                    <ConfirmButton label="Revoke" confirmLabel={`Revoke ${token.name}`} onConfirm={() => revoke(token.id)} />
                  </td>
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      ) : null}
    </>
  );
}
