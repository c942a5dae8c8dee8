import { fireEvent, render, screen, waitFor, within } from "@testing-library/react";
import { MemoryRouter } from "react-router-dom";
import { afterEach, describe, expect, it, vi } from "vitest";
import type { AccessSession, Role } from "../api/types";
import { AuthProvider } from "../auth";
import { SessionsPage } from "../pages/Sessions";
import { WorkspaceContext, workspaceState } from "../workspace";

function session(overrides: Partial<AccessSession>): AccessSession {
  return {
    id: "5e55a0c1-0000-4000-8000-000000000001",
    user: "ellen",
    run: "tough-ocelot-1",
    job: "train",
    attempt: 2,
    kind: "terminal",
    port: null,
    state: "open",
    client_address: "203.0.113.7",
    client_label: "browser terminal",
    created_at: new Date(Date.now() - 5 * 60_000).toISOString(),
    started_at: new Date(Date.now() - 5 * 60_000).toISOString(),
    ended_at: null,
    end_reason: "",
    bytes_up: 1536,
    bytes_down: 3 * 2 ** 20,
    last_activity_at: new Date().toISOString(),
    ...overrides,
  };
}

type Call = { method: string; url: string };

/** The server: who is signed in, the session lists in turn (the last one repeats), and answers to given requests. */
function serve(username: string, lists: AccessSession[][], answers: Record<string, () => Response> = {}) {
  const calls: Call[] = [];
  let listed = 0;
  vi.stubGlobal(
    "fetch",
    vi.fn(async (url: string, init: RequestInit = {}) => {
      const method = init.method ?? "GET";
      calls.push({ method, url });
      const answer = answers[`${method} ${url}`];
      if (answer) return answer();
      if (url === "/api/v1/me/") return new Response(JSON.stringify({ username, workspaces: [] }));
      if (url === "/api/v1/auth/config/") return new Response(JSON.stringify({ github: true, local_login: false }));
      return new Response(JSON.stringify(lists[Math.min(listed++, lists.length - 1)]));
    }),
  );
  return calls;
}

function renderPage(role: Role) {
  render(
    <AuthProvider>
      <WorkspaceContext.Provider value={workspaceState({ slug: "acme", name: "Acme", role }, [], async () => {})}>
        <MemoryRouter>
          <SessionsPage />
        </MemoryRouter>
      </WorkspaceContext.Provider>
    </AuthProvider>,
  );
}

afterEach(() => vi.unstubAllGlobals());

describe("SessionsPage", () => {
  it("lists the live sessions: who, the run and job, kind, from where, state and bytes each way", async () => {
    const calls = serve("dana", [
      [
        session({}),
        session({ id: "s-2", user: "dana", kind: "port", port: 8888, client_label: "app proxy", client_address: null }),
        session({ id: "s-3", user: "dana", kind: "port", port: 6006, client_label: "cli forward", state: "granted", started_at: null }),
        session({ id: "s-4", kind: "ssh", client_label: "cli ssh" }),
      ],
    ]);
    renderPage("admin");

    const row = (await screen.findByText("browser terminal")).closest("tr")!;
    const cells = within(row).getAllByRole("cell").map((cell) => cell.textContent);
    expect(cells.slice(0, 7)).toEqual(["ellen", "tough-ocelot-1 / train", "2", "terminal", "browser terminal203.0.113.7", "5 minutes ago", "open"]);
    expect(cells[7]).toBe("↓ 3.0 MB↑ 1.5 KB");
    expect(within(row).getByRole("link", { name: "tough-ocelot-1 / train" })).toHaveAttribute("href", "/w/acme/runs/tough-ocelot-1?job=train");
    expect(within(row).getByRole("time")).toHaveAttribute("title", expect.stringMatching(/\d/));
    expect(within(screen.getByText("app proxy").closest("tr")!).getByText("app proxy (port 8888)")).toBeTruthy();
    expect(within(screen.getByText("cli forward").closest("tr")!).getByText("port 6006")).toBeTruthy();
    expect(within(screen.getByText("cli ssh").closest("tr")!).getByText("ssh")).toBeTruthy();
    expect(screen.queryByRole("columnheader", { name: "End reason" })).toBeNull();
    expect(calls.find((c) => c.url.startsWith("/api/v1/workspaces/"))?.url).toBe("/api/v1/workspaces/acme/sessions/?live=1");
  });

  it("shows ended sessions and why they ended when asked", async () => {
    const calls = serve("dana", [
      [session({})],
      [session({}), session({ id: "s-2", state: "ended", ended_at: new Date().toISOString(), end_reason: "idle for 30 minutes" })],
    ]);
    renderPage("admin");
    await screen.findByText("browser terminal");

    fireEvent.click(screen.getByRole("checkbox", { name: "Show ended" }));

    const ended = (await screen.findByText("idle for 30 minutes")).closest("tr")!;
    expect(within(ended).getByText("ended")).toBeTruthy();
    expect(within(ended).queryByRole("button", { name: "End" })).toBeNull();
    expect(screen.getByRole("columnheader", { name: "End reason" })).toBeTruthy();
    expect(calls.filter((c) => c.url.includes("/sessions/")).map((c) => c.url)).toContain("/api/v1/workspaces/acme/sessions/");
  });

  it("offers End on every live row to an admin", async () => {
    serve("dana", [[session({}), session({ id: "s-2", user: "dana" })]]);
    renderPage("admin");
    await screen.findByText("ellen");
    expect(screen.getAllByRole("button", { name: "End" })).toHaveLength(2);
  });

  it("offers End to a member on their own sessions only", async () => {
    serve("ellen", [[session({}), session({ id: "s-2", user: "frank" })]]);
    renderPage("member");
    await screen.findByText("frank");
    expect(within(screen.getByText("ellen").closest("tr")!).getByRole("button", { name: "End" })).toBeTruthy();
    expect(within(screen.getByText("frank").closest("tr")!).queryByRole("button", { name: "End" })).toBeNull();
  });

  it("ends a session after confirming: the row says ended and why", async () => {
    const endedNow = session({ state: "ended", ended_at: new Date().toISOString(), end_reason: "ended by an admin (dana)", bytes_down: 4096 });
    const calls = serve("dana", [[session({})], []], {
      [`POST /api/v1/workspaces/acme/sessions/${endedNow.id}/end/`]: () => new Response(JSON.stringify(endedNow)),
    });
    renderPage("admin");

    fireEvent.click(await screen.findByRole("button", { name: "End" }));
    fireEvent.click(screen.getByRole("button", { name: "End ellen's terminal session" }));

    const row = (await screen.findByText("ended by an admin (dana)")).closest("tr")!;
    expect(within(row).getByText("ended")).toBeTruthy();
    expect(within(row).getByText("↓ 4.0 KB")).toBeTruthy();
    expect(within(row).queryByRole("button", { name: "End" })).toBeNull();
    await waitFor(() => expect(calls.filter((c) => c.method === "POST").map((c) => c.url)).toEqual([`/api/v1/workspaces/acme/sessions/${endedNow.id}/end/`]));
  });

  it("shows the server's refusal to end a session and keeps the row", async () => {
    serve("ellen", [[session({})]], {
      [`POST /api/v1/workspaces/acme/sessions/${session({}).id}/end/`]: () =>
        new Response(JSON.stringify({ message: `Session ${session({}).id} not found.`, extra: {} }), { status: 404 }),
    });
    renderPage("member");

    fireEvent.click(await screen.findByRole("button", { name: "End" }));
    fireEvent.click(screen.getByRole("button", { name: "End ellen's terminal session" }));

    expect(await screen.findByRole("alert")).toHaveTextContent(`Session ${session({}).id} not found.`);
    expect(within(screen.getByText("ellen").closest("tr")!).getByText("open")).toBeTruthy();
  });

  it("tells a viewer they cannot open sessions, and asks the server nothing", async () => {
    const calls = serve("vic", [[session({})]]);
    renderPage("viewer");
    expect(await screen.findByText(/Viewers cannot open sessions into jobs/)).toBeTruthy();
    expect(screen.queryByRole("table")).toBeNull();
    expect(calls.filter((c) => c.url.includes("/sessions/"))).toEqual([]);
  });
});
