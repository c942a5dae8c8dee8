import { useState, type FormEvent } from "react";
import { useNavigate } from "react-router-dom";
import { errorMessage, post } from "../api/client";
import type { WorkspaceRef } from "../api/types";
import { useAuth } from "../auth";
import { ErrorBanner, PageHeader } from "../components/ui";
import { rememberWorkspace } from "../lib/hooks";
import { useWorkspace } from "../workspace";

export function NewWorkspacePage() {
  const { reloadWorkspaces } = useWorkspace();
  const { refresh } = useAuth();
  const navigate = useNavigate();
  const [name, setName] = useState("");
  const [slug, setSlug] = useState("");
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);

  const submit = async (event: FormEvent) => {
    event.preventDefault();
    setBusy(true);
    setError(null);
    try {
      const body = slug.trim() ? { name: name.trim(), slug: slug.trim() } : { name: name.trim() };
      const created = await post<WorkspaceRef>("/api/v1/workspaces/", body);
      rememberWorkspace(created.slug);
      await Promise.all([reloadWorkspaces(), refresh()]);
      navigate(`/w/${created.slug}/members`);
    } catch (caught) {
      setError(errorMessage(caught));
    } finally {
      setBusy(false);
    }
  };
  return (
    <>
      <PageHeader title="New team workspace" />
      <p className="lede">A workspace holds runs, tags, secrets and members. You become its admin and can invite your team next.</p>
      <form className="form-stack card narrow" onSubmit={submit} aria-label="Create a workspace">
        <ErrorBanner error={error} />
        <label>
          Name
          <input value={name} onChange={(e) => setName(e.target.value)} required placeholder="Vision team" />
        </label>
        <label>
          Slug <span className="muted">(optional: made from the name)</span>
          <input value={slug} onChange={(e) => setSlug(e.target.value.toLowerCase())} pattern="[a-z0-9][a-z0-9-]*" placeholder="vision-team" />
        </label>
        <button type="submit" className="btn btn-primary" disabled={busy}>
          {busy ? "Creating…" : "Create workspace"}
        </button>
      </form>
    </>
  );
}
