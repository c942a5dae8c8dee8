import { createContext, useContext } from "react";
import type { Role, WorkspaceRef } from "./api/types";

export interface WorkspaceState {
  slug: string;
  name: string;
  role: Role;
  /** Members and admins may start, stop and tag runs and set secrets. */
  canWrite: boolean;
  /** Admins manage members. */
  isAdmin: boolean;
  workspaces: WorkspaceRef[];
  reloadWorkspaces: () => Promise<void>;
}

export const WorkspaceContext = createContext<WorkspaceState | null>(null);

export function useWorkspace(): WorkspaceState {
  const value = useContext(WorkspaceContext);
  if (!value) throw new Error("useWorkspace outside a workspace route");
  return value;
}

export function workspaceState(
  ref: WorkspaceRef,
  workspaces: WorkspaceRef[],
  reloadWorkspaces: () => Promise<void>,
): WorkspaceState {
  return {
    slug: ref.slug,
    name: ref.name,
    role: ref.role,
    canWrite: ref.role === "admin" || ref.role === "member",
    isAdmin: ref.role === "admin",
    workspaces,
    reloadWorkspaces,
  };
}
