import { useState, type FormEvent } from "react";
import { del, get, patch, post, wsPath } from "../api/client";
import type { Invitation, Member, Role } from "../api/types";
import { useAuth } from "../auth";
import { ACTIONS_COLUMN, DataTable } from "../components/DataTable";
import { ConfirmButton, ErrorBanner, Notice, PageHeader, Time } from "../components/ui";
import { useApiList, useResource } from "../lib/hooks";
import { useWorkspace } from "../workspace";

const ROLES: Role[] = ["admin", "member", "viewer"];

export function MembersPage() {
  const { slug, isAdmin } = useWorkspace();
  const { me } = useAuth();
  const members = useApiList<Member>(slug, () => get<Member[]>(wsPath(slug, "members/")));
  const invitations = useResource<Invitation[]>(isAdmin ? slug : null, () => get<Invitation[]>(wsPath(slug, "invitations/")));
  const [notice, setNotice] = useState<string | null>(null);

  const run = async (action: () => Promise<unknown>, done?: string) => {
    members.setActionError(null);
    setNotice(null);
    await members.act(
      async () => {
        await action();
        if (done) setNotice(done);
      },
      isAdmin ? invitations.reload : undefined,
    );
  };

  return (
    <>
      <PageHeader title="Members" />
      <ErrorBanner error={members.error ?? members.actionError} />
      {notice ? <Notice>{notice}</Notice> : null}
      {isAdmin ? <InviteForm onInvite={(body, label) => run(() => post(wsPath(slug, "members/"), body), label)} /> : null}
      <DataTable
        rows={members.data}
        error={members.error}
        columns={["Person", "Role", "Joined", isAdmin && ACTIONS_COLUMN]}
        renderRow={(member) => (
          <tr key={member.username}>
            <td>
              <span className="person">
                {member.avatar_url ? <img className="avatar" src={member.avatar_url} alt="" /> : <span className="avatar avatar-blank" aria-hidden="true" />}
                {member.username}
                {member.username === me?.username ? <span className="muted"> (you)</span> : null}
              </span>
            </td>
            <td>
              {isAdmin ? (
                <select
                  aria-label={`Role of ${member.username}`}
                  value={member.role}
                  onChange={(e) => void run(() => patch(wsPath(slug, `members/${encodeURIComponent(member.username)}/`), { role: e.target.value }), `${member.username} is now ${e.target.value}.`)}
                >
                  {ROLES.map((role) => (
                    <option key={role} value={role}>
                      {role}
                    </option>
                  ))}
                </select>
              ) : (
                member.role
              )}
            </td>
            <td>
              <Time iso={member.joined_at} />
            </td>
            {isAdmin ? (
              <td className="actions">
                <ConfirmButton
                  label="Remove"
                  confirmLabel={`Remove ${member.username}`}
                  onConfirm={() => run(() => del(wsPath(slug, `members/${encodeURIComponent(member.username)}/`)), `${member.username} removed.`)}
                />
              </td>
            ) : null}
          </tr>
        )}
      />
      {isAdmin && invitations.data && invitations.data.length ? (
        <section aria-labelledby="invitations">
          <h2 id="invitations">Pending invitations</h2>
          <DataTable
            rows={invitations.data}
            columns={["Invited", "Role", "Sent", ACTIONS_COLUMN]}
            renderRow={(invitation) => (
              <tr key={invitation.id}>
                <td>
                  {invitation.github_login ? `@${invitation.github_login}` : invitation.email}
                  {invitation.github_id != null ? <span className="muted"> (GitHub id {invitation.github_id})</span> : null}
                </td>
                <td>{invitation.role}</td>
                <td>
                  <Time iso={invitation.created_at} />
                </td>
                <td className="actions">
                  <ConfirmButton
                    label="Revoke"
                    confirmLabel="Revoke invitation"
                    onConfirm={() => run(() => del(wsPath(slug, `invitations/${invitation.id}/`)), "Invitation revoked.")}
                  />
                </td>
              </tr>
            )}
          />
        </section>
      ) : null}
    </>
  );
}

function InviteForm({ onInvite }: { onInvite: (body: Record<string, string>, done: string) => Promise<void> }) {
  const [who, setWho] = useState("");
  const [role, setRole] = useState<Role>("member");
  const submit = async (event: FormEvent) => {
    event.preventDefault();
    const value = who.trim();
    const body: Record<string, string> = value.includes("@") && !value.startsWith("@")
      ? { email: value, role }
      : { github_login: value.replace(/^@/, ""), role };
    await onInvite(body, `Invited ${value} as ${role}. They join at their next sign-in if they have no account yet.`);
    setWho("");
  };
  return (
    <form className="inline-form card" onSubmit={submit} aria-label="Invite a member">
      <label>
        GitHub username or email
        <input value={who} onChange={(e) => setWho(e.target.value)} placeholder="octocat or ada@example.com" required autoComplete="off" />
      </label>
      <label>
        Role
        <select value={role} onChange={(e) => setRole(e.target.value as Role)}>
          {ROLES.map((r) => (
            <option key={r} value={r}>
              {r}
            </option>
          ))}
        </select>
      </label>
      <button type="submit" className="btn btn-primary">
        Invite
      </button>
    </form>
  );
}
