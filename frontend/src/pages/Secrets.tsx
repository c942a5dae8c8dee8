import { useState, type FormEvent } from "react";
import { del, errorMessage, get, put, wsPath } from "../api/client";
import type { Secret } from "../api/types";
import { ConfirmButton, EmptyState, ErrorBanner, Loading, Notice, PageHeader, Time } from "../components/ui";
import { useResource } from "../lib/hooks";
import { useWorkspace } from "../workspace";

const NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

export function SecretsPage() {
  const { slug, canWrite } = useWorkspace();
  const secrets = useResource<Secret[]>(slug, () => get<Secret[]>(wsPath(slug, "secrets/")));
  const [name, setName] = useState("");
  const [value, setValue] = useState("");
  const [error, setError] = useState<string | null>(null);
  const [saved, setSaved] = useState<string | null>(null);

  const save = async (event: FormEvent) => {
    event.preventDefault();
    setError(null);
    setSaved(null);
    if (!NAME.test(name)) {
      setError("A secret's name is letters, digits and underscores, not starting with a digit (it becomes an environment variable).");
      return;
    }
    try {
      await put(wsPath(slug, `secrets/${encodeURIComponent(name)}/`), { value });
      setSaved(name);
      setName("");
      setValue("");
      await secrets.reload();
    } catch (caught) {
      setError(errorMessage(caught));
    }
  };
  const remove = async (secret: string) => {
    try {
      await del(wsPath(slug, `secrets/${encodeURIComponent(secret)}/`));
      await secrets.reload();
    } catch (caught) {
      setError(errorMessage(caught));
    }
  };

  return (
    <>
      <PageHeader title="Secrets" />
      <p className="lede">
        Jobs get secrets as environment variables and they are masked in logs. Values are write-only: nobody can read them back here.
      </p>
      <ErrorBanner error={secrets.error ?? error} />
      {saved ? <Notice>Secret {saved} saved.</Notice> : null}
      {canWrite ? (
        <form className="inline-form card" onSubmit={save} aria-label="Set a secret">
          <label>
            Name
            <input value={name} onChange={(e) => setName(e.target.value.toUpperCase())} placeholder="HF_TOKEN" required autoComplete="off" spellCheck={false} />
          </label>
          <label>
            Value
            <input type="password" value={value} onChange={(e) => setValue(e.target.value)} required autoComplete="new-password" />
          </label>
          <button type="submit" className="btn btn-primary">
            Save secret
          </button>
        </form>
      ) : null}
      {!secrets.data && !secrets.error ? <Loading /> : null}
      {secrets.data && !secrets.data.length ? <EmptyState title="No secrets yet" /> : null}
      {secrets.data && secrets.data.length ? (
        <div className="table-wrap">
          <table className="table">
            <thead>
              <tr>
                <th scope="col">Name</th>
                <th scope="col">Created</th>
                <th scope="col">Updated</th>
                {canWrite ? <th scope="col"><span className="visually-hidden">Actions</span></th> : null}
              </tr>
            </thead>
            <tbody>
              {secrets.data.map((secret) => (
                <tr key={secret.name}>
                  <td className="mono">{secret.name}</td>
                  <td>
                    <Time iso={secret.created_at} />
                  </td>
                  <td>
                    <Time iso={secret.updated_at} />
                  </td>
                  {canWrite ? (
                    <td className="actions">
                      <ConfirmButton label="Delete" confirmLabel={`Delete secret ${secret.name}`} onConfirm={() => remove(secret.name)} />
                    </td>
                  ) : null}
                </tr>
              ))}
            </tbody>
          </table>
        </div>
      ) : null}
    </>
  );
}
