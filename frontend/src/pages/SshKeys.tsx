import { useState, type FormEvent } from "react";
import { del, get, post } from "../api/client";
import type { SshKey } from "../api/types";
import { ACTIONS_COLUMN, DataTable } from "../components/DataTable";
import { ConfirmButton, EmptyState, ErrorBanner, PageHeader, Time } from "../components/ui";
import { useApiList } from "../lib/hooks";

export function SshKeysPage() {
  const keys = useApiList<SshKey>("ssh-keys", () => get<SshKey[]>("/api/v1/me/ssh-keys/"));
  const [publicKey, setPublicKey] = useState("");
  const [name, setName] = useState("");

  const add = async (event: FormEvent) => {
    event.preventDefault();
    keys.setActionError(null);
    await keys.act(async () => {
      await post<SshKey>("/api/v1/me/ssh-keys/", { public_key: publicKey, name: name.trim() });
      setPublicKey("");
      setName("");
    });
  };
  const remove = (id: string) => keys.act(() => del(`/api/v1/me/ssh-keys/${id}/`));

  return (
    <>
      <PageHeader title="SSH keys" />
      <p className="lede">
        Your SSH public keys open <code>trainyard ssh</code>, <code>scp</code>, <code>rsync</code> and VS Code into the running jobs of every workspace
        where you may run jobs. Paste a <code>.pub</code> file (e.g. <code>~/.ssh/id_ed25519.pub</code>), or run <code>trainyard ssh-key add</code>.
      </p>
      <ErrorBanner error={keys.error ?? keys.actionError} />
      <form className="inline-form card" onSubmit={add} aria-label="Add an SSH key">
        <label>
          Public key
          <textarea
            value={publicKey}
            onChange={(e) => setPublicKey(e.target.value)}
            placeholder="ssh-ed25519 AAAA… you@laptop"
            rows={3}
            required
            spellCheck={false}
            autoComplete="off"
          />
        </label>
        <label>
          Name
          <input value={name} onChange={(e) => setName(e.target.value)} placeholder="the key's comment" autoComplete="off" />
        </label>
        <button type="submit" className="btn btn-primary">
          Add key
        </button>
      </form>
      <DataTable
        rows={keys.data}
        error={keys.error}
        empty={<EmptyState title="No SSH keys yet" />}
        columns={["Name", "Fingerprint", "Type", "Added", "Last used", ACTIONS_COLUMN]}
        renderRow={(key) => (
          <tr key={key.id}>
            <td>{key.name}</td>
            <td className="mono small">{key.fingerprint}</td>
            <td className="mono small">{key.public_key.split(" ")[0]}</td>
            <td>
              <Time iso={key.created_at} />
            </td>
            <td>{key.last_used_at ? <Time iso={key.last_used_at} /> : <span className="muted">never</span>}</td>
            <td className="actions">
              <ConfirmButton label="Remove" confirmLabel={`Remove ${key.name}`} onConfirm={() => remove(key.id)} />
            </td>
          </tr>
        )}
      />
    </>
  );
}
