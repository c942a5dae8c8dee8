import { useCallback, useEffect, useMemo, useState } from "react";
import { NavLink, Outlet, useNavigate, useParams } from "react-router-dom";
import { get } from "../api/client";
import type { WorkspaceRef } from "../api/types";
import { useAuth } from "../auth";
import { rememberWorkspace } from "../lib/hooks";
import { WorkspaceContext, workspaceState } from "../workspace";

const NAV = [
  { to: "runs", label: "Runs" },
  { to: "tags", label: "Tags" },
  { to: "environments", label: "Environments" },
  { to: "repos", label: "Repos" },
  { to: "instances", label: "Runners & instances" },
  { to: "sessions", label: "Sessions", writersOnly: true },
  { to: "self-hosted", label: "Self-hosted runners" },
  { to: "backends", label: "Backends" },
  { to: "offers", label: "Offers" },
  { to: "costs", label: "Costs" },
  { to: "volumes", label: "Volumes" },
  { to: "secrets", label: "Secrets" },
  { to: "members", label: "Members" },
  { to: "audit", label: "Audit log", adminOnly: true },
  { to: "tokens", label: "API tokens" },
  { to: "ssh-keys", label: "SSH keys" },
];

/** Admin pages for admins; pages of what viewers cannot do (sessions) for members and admins. */
function mayOpen(item: (typeof NAV)[number], role: string | undefined): boolean {
  if ("adminOnly" in item) return role === "admin";
  if ("writersOnly" in item) return role === "admin" || role === "member";
  return true;
}

export function Layout() {
  const { ws = "" } = useParams();
  const { me, signOut } = useAuth();
  const navigate = useNavigate();
  const [workspaces, setWorkspaces] = useState<WorkspaceRef[]>(me?.workspaces ?? []);

  const reloadWorkspaces = useCallback(async () => {
    try {
      setWorkspaces(await get<WorkspaceRef[]>("/api/v1/workspaces/"));
    } catch {
      // Older servers have no /workspaces/ list: me.workspaces is the same list.
      setWorkspaces(me?.workspaces ?? []);
    }
  }, [me]);

  useEffect(() => {
    void reloadWorkspaces();
  }, [reloadWorkspaces]);

  const current = workspaces.find((w) => w.slug === ws) ?? me?.workspaces.find((w) => w.slug === ws);
  useEffect(() => {
    if (current) rememberWorkspace(current.slug);
  }, [current]);

  const state = useMemo(
    () => (current ? workspaceState(current, workspaces, reloadWorkspaces) : null),
    [current, workspaces, reloadWorkspaces],
  );

  const switchTo = (slug: string) => {
    if (slug === "__new__") {
      navigate(`/w/${ws}/new-workspace`);
      return;
    }
    rememberWorkspace(slug);
    navigate(`/w/${slug}/runs`);
  };

  return (
    <div className="app">
      <a className="skip-link" href="#main">
        Skip to content
      </a>
      <aside className="sidebar">
        <div className="sidebar-inner">
          <div className="brand">
            <span className="brand-mark" aria-hidden="true" />
            Trainyard
          </div>
          <label className="ws-switcher">
            <span className="label">Workspace</span>
            <select value={current ? ws : ""} onChange={(event) => switchTo(event.target.value)}>
              {current ? null : <option value="">—</option>}
              {workspaces.map((w) => (
                <option key={w.slug} value={w.slug}>
                  {w.name}
                  {w.personal ? " (personal)" : ""}
                </option>
              ))}
              <option value="__new__">+ New team workspace…</option>
            </select>
          </label>
          <nav aria-label="Workspace">
            <ul>
              {NAV.filter((item) => mayOpen(item, current?.role)).map((item) => (
                <li key={item.to}>
                  <NavLink to={`/w/${ws}/${item.to}`}>{item.label}</NavLink>
                </li>
              ))}
            </ul>
          </nav>
          <div className="sidebar-footer">
            <div className="user">
              {me?.avatar_url ? <img src={me.avatar_url} alt="" className="avatar" /> : <span className="avatar avatar-blank" aria-hidden="true" />}
              <span className="user-name">{me?.username}</span>
              {current ? <span className="role">{current.role}</span> : null}
            </div>
            <button type="button" className="btn btn-small btn-ghost" onClick={() => void signOut()}>
              Sign out
            </button>
          </div>
        </div>
      </aside>
      <main id="main" className="content" tabIndex={-1}>
        {state ? (
          <WorkspaceContext.Provider value={state}>
            <Outlet />
          </WorkspaceContext.Provider>
        ) : (
          <div className="empty">
            <h1>Workspace “{ws}” not found</h1>
            <p>It does not exist or you are not a member of it.</p>
            {workspaces[0] ? <a href={`/w/${workspaces[0].slug}/runs`}>Go to {workspaces[0].name}</a> : null}
          </div>
        )}
      </main>
    </div>
  );
}
