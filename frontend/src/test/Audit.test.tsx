import { fireEvent, render, screen, waitFor, within } from "@testing-library/react";
import { MemoryRouter } from "react-router-dom";
import { afterEach, describe, expect, it, vi } from "vitest";
import type { AuditEvent, Role } from "../api/types";
import { AuditPage } from "../pages/Audit";
import { WorkspaceContext, workspaceState } from "../workspace";

function event(overrides: Partial<AuditEvent>): AuditEvent {
  return {
    id: "e-1",
    at: new Date().toISOString(),
    kind: "secret",
    action: "secret.created",
    target: "HF_TOKEN",
    actor: "user",
    username: "olivia",
    runner: "",
    address: "198.51.100.4",
    detail: {},
    ...overrides,
  };
}

function serve(pages: Record<string, { next: string | null; results: AuditEvent[] }>) {
  const urls: string[] = [];
  vi.stubGlobal(
    "fetch",
    vi.fn(async (url: string) => {
      urls.push(url);
      const query = new URL(url, "http://x").search;
      return new Response(JSON.stringify(pages[query] ?? { next: null, results: [] }));
    }),
  );
  return urls;
}

function renderPage(role: Role = "admin") {
  const workspace = workspaceState({ slug: "acme", name: "Acme", role }, [], async () => {});
  render(
    <WorkspaceContext.Provider value={workspace}>
      <MemoryRouter>
        <AuditPage />
      </MemoryRouter>
    </WorkspaceContext.Provider>,
  );
}

afterEach(() => vi.unstubAllGlobals());

describe("AuditPage", () => {
  it("shows who did what from where, loads older pages and filters by kind", async () => {
    const urls = serve({
      "": { next: "http://x/api/v1/workspaces/acme/audit/?cursor=c2", results: [event({})] },
      "?cursor=c2": { next: null, results: [event({ id: "e-2", action: "runner.registered", actor: "runner", runner: "lab-1", username: "", target: "lab-1", address: "192.0.2.9" })] },
      "?kind=member": { next: null, results: [event({ id: "e-3", kind: "member", action: "member.removed", target: "mateo" })] },
    });
    renderPage();

    const first = (await screen.findByText("secret.created")).closest("tr")!;
    expect(within(first).getByText("olivia")).toBeTruthy();
    expect(within(first).getByText("HF_TOKEN")).toBeTruthy();
    expect(within(first).getByText("198.51.100.4")).toBeTruthy();

    fireEvent.click(screen.getByRole("button", { name: "Older events" }));
    const older = (await screen.findByText("runner.registered")).closest("tr")!;
    expect(within(older).getByText("runner lab-1")).toBeTruthy();
    expect(screen.queryByRole("button", { name: "Older events" })).toBeNull();

    fireEvent.change(screen.getByLabelText("Kind"), { target: { value: "member" } });
    await screen.findByText("member.removed");
    await waitFor(() => expect(screen.queryByText("secret.created")).toBeNull());
    expect(urls).toEqual([
      "/api/v1/workspaces/acme/audit/",
      "/api/v1/workspaces/acme/audit/?cursor=c2",
      "/api/v1/workspaces/acme/audit/?kind=member",
    ]);
  });

  it("tells a member the log is for admins and asks nothing", () => {
    const urls = serve({});
    renderPage("member");

    expect(screen.getByText("Only the workspace's admins read its audit log.")).toBeTruthy();
    expect(urls).toEqual([]);
  });
});
