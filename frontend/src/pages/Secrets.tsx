import { useState, type FormEvent } from "react";
import { del, get, put, wsPath } from "../api/client";
import type { Secret } from "../api/types";
import { ACTIONS_COLUMN, DataTable } from "../components/DataTable";
import { ConfirmButton, EmptyState, ErrorBanner, Notice, PageHeader, Time } from "../components/ui";
import { useApiList } from "../lib/hooks";
import { useWorkspace } from "../workspace";

const NAME = /^[A-Za-z_][A-Za-z0-9_]*$/;

export function SecretsPage() {
  // Secrets are set and deleted by admins only; members and viewers see the names.
  const { slug, isAdmin: canWrite } = useWorkspace();
  const secrets = useApiList<Secret>(slug, () => get<Secret[]>(wsPath(slug, "secrets/")));
  const [name, setName] = useState("");
  const [value, setValue] = useState("");
  const [saved, setSaved] = useState<string | null>(null);

  const save = async (event: FormEvent) => {
    event.preventDefault();
    secrets.setActionError(null);
    setSaved(null);
    if (!NAME.test(name)) {
      secrets.setActionError("A secret's name is letters, digits and underscores, not starting with a digit (it becomes an environment variable).");
      return;
    }
    await secrets.act(async () => {
      await put(wsPath(slug, `secrets/${encodeURIComponent(name)}/`), { value });
      setSaved(name);
      setName("");
      setValue("");
    });
  };
  const remove = (secret: string) => secrets.act(() => del(wsPath(slug, `secrets/${encodeURIComponent(secret)}/`)));

  return (
    <>
      <PageHeader title="Secrets" />
      <p className="lede">
        A job gets the secrets its workflow names (<code>secrets: [NAME]</code> or <code>{"${{ secrets.NAME }}"}</code>) as environment variables, and
        they are masked in logs. Values are write-only: nobody can read them back here.
        {canWrite ? null : " Only workspace admins set and delete secrets."}
      </p>
      <ErrorBanner error={secrets.error ?? secrets.actionError} />
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
      <DataTable
        rows={secrets.data}
        error={secrets.error}
        empty={<EmptyState title="No secrets yet" />}
        columns={["Name", "Created", "Updated", canWrite && ACTIONS_COLUMN]}
        renderRow={(secret) => (
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
        )}
      />
    </>
  );
}
