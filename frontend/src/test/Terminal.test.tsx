import { act, fireEvent, render, screen, waitFor, within } from "@testing-library/react";
import { MemoryRouter, Route, Routes } from "react-router-dom";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { SocketFactoryContext, type SocketLike } from "../api/live";
import { RECONNECT_WINDOW_MS, RelayConnection, RelaySocketFactoryContext, type RelayPhase, type RelaySocket } from "../api/relay";
import type { Job, Run } from "../api/types";
import { TerminalPanel } from "../components/Terminal";
import { RunPage } from "../pages/RunDetail";
import { WorkspaceContext, workspaceState } from "../workspace";
import type { Role } from "../api/types";

/** The browser's WebSocket as the relay's client end sees it; the test plays the server. */
class FakeRelaySocket implements RelaySocket {
  onopen: RelaySocket["onopen"] = null;
  onmessage: RelaySocket["onmessage"] = null;
  onclose: RelaySocket["onclose"] = null;
  onerror: RelaySocket["onerror"] = null;
  binaryType: BinaryType = "blob";
  readyState = 0;
  closedWith: number | null = null;
  readonly sent: (string | Uint8Array)[] = [];
  constructor(readonly url: string) {}

  send(data: string | ArrayBufferView<ArrayBuffer>) {
    this.sent.push(typeof data === "string" ? data : new Uint8Array(data.buffer, data.byteOffset, data.byteLength).slice());
  }
  close(code = 1000) {
    this.closedWith = code;
    this.readyState = 3;
  }
  // --- the server's side
  accept() {
    this.readyState = 1;
    act(() => this.onopen?.(new Event("open")));
  }
  text(message: unknown) {
    act(() => this.onmessage?.(new MessageEvent("message", { data: JSON.stringify(message) })));
  }
  bytes(text: string) {
    const encoded = new TextEncoder().encode(text);
    const buffer = new ArrayBuffer(encoded.byteLength);
    new Uint8Array(buffer).set(encoded);
    act(() => this.onmessage?.(new MessageEvent("message", { data: buffer })));
  }
  drop(code = 1006, reason = "") {
    this.readyState = 3;
    act(() => this.onclose?.(new CloseEvent("close", { code, reason })));
  }
  /** What the client sent: binary frames decoded, control messages parsed. */
  get typed(): string {
    return this.sent.filter((f): f is Uint8Array => typeof f !== "string").map((f) => new TextDecoder().decode(f)).join("");
  }
  get controls(): unknown[] {
    return this.sent.filter((f): f is string => typeof f === "string").map((f) => JSON.parse(f));
  }
}

function makeJob(overrides: Partial<Job> = {}): Job {
  return { id: "job-1", name: "train", status: "running", status_reason: "", attempts: [], ...overrides } as Job;
}

function makeRun(jobs: Job[]): Run {
  return { id: "run-1", name: "brave-otter-1", status: "running", jobs } as unknown as Run;
}

interface Granted {
  url: string;
  body: unknown;
  csrf: string | null;
}

function renderPanel({ job = makeJob(), role = "member" as Role, refuse }: { job?: Job | null; role?: Role; refuse?: string } = {}) {
  const sockets: FakeRelaySocket[] = [];
  const grants: Granted[] = [];
  const ends: string[] = [];
  document.cookie = "csrftoken=csrf-abc";
  vi.stubGlobal(
    "fetch",
    vi.fn(async (url: string, init: RequestInit) => {
      if (url.endsWith("/end/")) {
        ends.push(url);
        return new Response(JSON.stringify({ state: "ended" }));
      }
      grants.push({ url, body: JSON.parse(String(init.body)), csrf: new Headers(init.headers).get("X-CSRFToken") });
      if (refuse) return new Response(JSON.stringify({ detail: refuse }), { status: 409 });
      const id = `session-${grants.length}`;
      return new Response(JSON.stringify({ id, url: `ws://testserver/ws/v1/relay/${id}/`, kind: "terminal", job: "train" }), { status: 201 });
    }),
  );
  const workspace = workspaceState({ slug: "acme", name: "Acme", role }, [], async () => {});
  const factory = (url: string) => {
    const socket = new FakeRelaySocket(url);
    sockets.push(socket);
    return socket;
  };
  const panel = (
    <RelaySocketFactoryContext.Provider value={factory}>
      <WorkspaceContext.Provider value={workspace}>
        <TerminalPanel run={makeRun(job ? [job] : [])} job={job} shown />
      </WorkspaceContext.Provider>
    </RelaySocketFactoryContext.Provider>
  );
  const { unmount } = render(panel);
  /** The page reloaded: the same panel, mounted anew in this browser tab. */
  const reload = () => {
    unmount();
    render(panel);
  };
  return { sockets, grants, ends, reload };
}

const input = (panel: HTMLElement) => within(panel).getByRole("textbox", { name: "Terminal input" });
const screenText = (panel: HTMLElement) => panel.querySelector(".xterm-rows")?.textContent ?? "";

// jsdom has no matchMedia, which xterm asks for the device pixel ratio's changes,
// and no canvas, where xterm would measure its glyphs.
beforeEach(() => {
  sessionStorage.clear();
  vi.spyOn(HTMLCanvasElement.prototype, "getContext").mockReturnValue(null);
  vi.stubGlobal("matchMedia", (query: string) => ({ matches: false, media: query, addListener() {}, removeListener() {}, addEventListener() {}, removeEventListener() {} }));
});

afterEach(() => {
  vi.restoreAllMocks();
  vi.unstubAllGlobals();
  vi.useRealTimers();
});

describe("TerminalPanel", () => {
  it("grants a terminal session for the job with the CSRF header and opens its socket", async () => {
    const { sockets, grants } = renderPanel();
    await waitFor(() => expect(sockets).toHaveLength(1));
    expect(grants).toEqual([{ url: "/api/v1/workspaces/acme/runs/run-1/sessions/", body: { job: "train", kind: "terminal", client: "browser terminal" }, csrf: "csrf-abc" }]);
    expect(sockets[0].url).toBe(`ws://${window.location.host}/ws/v1/relay/session-1/`);
    expect(sockets[0].binaryType).toBe("arraybuffer");
    expect(screen.getByRole("status")).toHaveTextContent("Connecting…");
    sockets[0].accept();
    expect(screen.getByRole("status")).toHaveTextContent("Connected");
  });

  it("sends keystrokes as binary frames, shows the shell's bytes and says its size", async () => {
    const { sockets } = renderPanel();
    await waitFor(() => expect(sockets).toHaveLength(1));
    const socket = sockets[0];
    socket.accept();
    expect(socket.controls).toEqual([{ type: "resize", cols: 80, rows: 24 }]);
    socket.text({ type: "ready" });
    expect(socket.controls).toEqual([
      { type: "resize", cols: 80, rows: 24 },
      { type: "resize", cols: 80, rows: 24 },
    ]);

    const panel = screen.getByRole("tabpanel");
    fireEvent.keyDown(input(panel), { key: "l", code: "KeyL", keyCode: 76 });
    fireEvent.keyDown(input(panel), { key: "s", code: "KeyS", keyCode: 83 });
    fireEvent.keyDown(input(panel), { key: "Enter", code: "Enter", keyCode: 13 });
    expect(socket.typed).toBe("ls\r");
    expect(socket.sent.filter((f) => typeof f !== "string")).toHaveLength(3);

    socket.bytes("\x1b[32mgreen\x1b[0m 日本 done\r\n$ ");
    await waitFor(() => expect(screenText(panel)).toContain("green 日本 done"));
    expect(panel.querySelector(".xterm-fg-2")).toHaveTextContent("green");
  });

  it("keeps Tab and Esc for the shell, and Ctrl+F6 moves the keyboard out of the terminal", async () => {
    const { sockets } = renderPanel();
    await waitFor(() => expect(sockets).toHaveLength(1));
    sockets[0].accept();
    const panel = screen.getByRole("tabpanel");
    fireEvent.keyDown(input(panel), { key: "Tab", code: "Tab", keyCode: 9 });
    fireEvent.keyDown(input(panel), { key: "Escape", code: "Escape", keyCode: 27 });
    expect(sockets[0].typed).toBe("\t\x1b");
    fireEvent.keyDown(input(panel), { key: "F6", code: "F6", keyCode: 117, ctrlKey: true });
    expect(sockets[0].typed).toBe("\t\x1b");
    expect(within(panel).getByRole("button", { name: "Close terminal train 1" })).toHaveFocus();
    expect(panel).toHaveTextContent("Leave: Ctrl+F6");
  });

  it("reconnects a dropped socket to the same session, saying so, without a new grant", async () => {
    const { sockets, grants } = renderPanel();
    await waitFor(() => expect(sockets).toHaveLength(1));
    sockets[0].accept();
    vi.useFakeTimers();
    sockets[0].drop(1006);
    const tab = screen.getByRole("tab", { name: /train 1/ });
    expect(screen.getByRole("status")).toHaveTextContent("reconnecting… (the shell keeps running)");
    expect(tab).toHaveTextContent("train 1 (reconnecting…)");

    act(() => vi.advanceTimersByTime(250));
    expect(sockets).toHaveLength(2);
    expect(sockets[1].url).toBe(sockets[0].url);
    sockets[1].drop(1006); // the server is still away: try again, later
    act(() => vi.advanceTimersByTime(499));
    expect(sockets).toHaveLength(2);
    act(() => vi.advanceTimersByTime(1));
    expect(sockets).toHaveLength(3);
    sockets[2].accept();
    expect(screen.getByRole("status")).toHaveTextContent("Connected");
    expect(tab).toHaveTextContent(/^train 1$/);
    expect(sockets[2].controls).toEqual([{ type: "resize", cols: 80, rows: 24 }]);
    expect(grants).toHaveLength(1);

    const panel = screen.getByRole("tabpanel");
    fireEvent.keyDown(input(panel), { key: "x", code: "KeyX", keyCode: 88 });
    expect(sockets[2].typed).toBe("x");
  });

  it("shows the server's end reason in the terminal and does not reconnect", async () => {
    const { sockets } = renderPanel();
    await waitFor(() => expect(sockets).toHaveLength(1));
    sockets[0].accept();
    vi.useFakeTimers();
    sockets[0].text({ type: "end", reason: "the machine is being reclaimed (spot): the job resumes on another; open a new terminal then" });
    sockets[0].drop(4409);
    act(() => vi.advanceTimersByTime(5_000));
    expect(sockets).toHaveLength(1);
    const panel = screen.getByRole("tabpanel");
    expect(screen.getByRole("status")).toHaveTextContent("Session ended: the machine is being reclaimed (spot)");
    expect(screen.getByRole("tab", { name: /train 1/ })).toHaveTextContent("train 1 (ended)");
    vi.useRealTimers();
    await waitFor(() => expect(screenText(panel)).toContain("session ended: the machine is being reclaimed (spot)"));
  });

  it("says what a close code means when the server gave no reason", async () => {
    const { sockets } = renderPanel();
    await waitFor(() => expect(sockets).toHaveLength(1));
    sockets[0].accept();
    sockets[0].drop(4408);
    expect(screen.getByRole("status")).toHaveTextContent("Session ended: it was idle for too long");
  });

  it("shows the grant's refusal instead of a terminal", async () => {
    const { sockets } = renderPanel({ refuse: "job train runs in Docker: terminals into Docker jobs are not supported yet" });
    await waitFor(() => expect(screen.getByRole("status")).toHaveTextContent("Session ended: job train runs in Docker: terminals into Docker jobs are not supported yet"));
    expect(sockets).toHaveLength(0);
  });

  it("opens several terminals, each its own session, and switches between them", async () => {
    const { sockets, grants, ends } = renderPanel();
    await waitFor(() => expect(sockets).toHaveLength(1));
    sockets[0].accept();
    fireEvent.click(screen.getByRole("button", { name: "New terminal in train" }));
    await waitFor(() => expect(sockets).toHaveLength(2));
    sockets[1].accept();
    expect(grants).toHaveLength(2);
    expect(sockets[1].url).toContain("/ws/v1/relay/session-2/");

    const [first, second] = screen.getAllByRole("tab");
    expect(first).toHaveAttribute("aria-selected", "false");
    expect(second).toHaveAttribute("aria-selected", "true");
    expect(screen.getByRole("tabpanel")).toHaveAttribute("id", "terminal-2");
    fireEvent.keyDown(input(screen.getByRole("tabpanel")), { key: "b", code: "KeyB", keyCode: 66 });
    fireEvent.click(first);
    expect(screen.getByRole("tabpanel")).toHaveAttribute("id", "terminal-1");
    fireEvent.keyDown(input(screen.getByRole("tabpanel")), { key: "a", code: "KeyA", keyCode: 65 });
    expect([sockets[0].typed, sockets[1].typed]).toEqual(["a", "b"]);

    fireEvent.click(within(screen.getByRole("tabpanel")).getByRole("button", { name: "Close terminal train 1" }));
    expect(sockets[0].closedWith).toBe(1000);
    expect(ends).toEqual(["/api/v1/workspaces/acme/sessions/session-1/end/"]);
    expect(screen.getAllByRole("tab")).toHaveLength(1);
    expect(screen.getByRole("tabpanel")).toHaveAttribute("id", "terminal-2");

    // An ended session is not ended again.
    sockets[1].drop(4409);
    fireEvent.click(within(screen.getByRole("tabpanel")).getByRole("button", { name: "Close terminal train 2" }));
    expect(ends).toHaveLength(1);
    expect(screen.queryAllByRole("tab")).toHaveLength(0);
  });

  it("reattaches to its terminals' sessions after a reload, without new grants", async () => {
    const { sockets, grants, ends, reload } = renderPanel();
    await waitFor(() => expect(sockets).toHaveLength(1));
    sockets[0].accept();
    fireEvent.click(screen.getByRole("button", { name: "New terminal in train" }));
    await waitFor(() => expect(sockets).toHaveLength(2));
    sockets[1].accept();

    reload();
    expect(sockets.slice(0, 2).map((s) => s.closedWith)).toEqual([1000, 1000]);
    expect(ends).toEqual([]); // their shells wait for the page to come back
    expect(sockets.slice(2).map((s) => s.url)).toEqual([sockets[0].url, sockets[1].url]);
    expect(grants).toHaveLength(2);
    sockets[2].accept();
    sockets[3].accept();
    expect(screen.getAllByRole("tab").map((t) => t.textContent)).toEqual(["train 1", "train 2"]);
    expect(screen.getByRole("tab", { name: "train 2" })).toHaveAttribute("aria-selected", "true");
    await waitFor(() => expect(screenText(screen.getByRole("tabpanel"))).toContain("(reattached after a reload: the same shell; what it showed before is not kept)"));
    fireEvent.click(screen.getByRole("button", { name: "New terminal in train" }));
    await waitFor(() => expect(sockets).toHaveLength(5));
    expect(screen.getAllByRole("tab").map((t) => t.textContent)).toEqual(["train 1", "train 2", "train 3"]);
  });

  it("drops a reattached terminal whose session is gone, opens a new one, and does not keep ended sessions", async () => {
    const { sockets, grants, reload } = renderPanel();
    await waitFor(() => expect(sockets).toHaveLength(1));
    sockets[0].accept();
    reload();
    sockets[1].drop(4404, "the session has ended: the client did not come back in time");
    await waitFor(() => expect(sockets).toHaveLength(3));
    expect(grants).toHaveLength(2);
    expect(screen.getAllByRole("tab").map((t) => t.textContent)).toEqual(["train 2"]);
    expect(screen.getByRole("status")).not.toHaveTextContent("ended");

    sockets[2].accept();
    sockets[2].drop(4409);
    reload();
    expect(sockets).toHaveLength(3); // nothing to reattach to
    await waitFor(() => expect(grants).toHaveLength(3));
  });

  it("offers no terminal to a viewer, and says why", () => {
    const { grants } = renderPanel({ role: "viewer" });
    expect(screen.getByRole("status")).toHaveTextContent("Viewers cannot open a terminal: a member or an admin of this workspace can.");
    expect(screen.queryByRole("button", { name: /New terminal/ })).toBeNull();
    expect(grants).toHaveLength(0);
  });

  it.each([
    ["pending", "Job train is pending: a terminal opens once it runs."],
    ["succeeded", "Job train has succeeded: a terminal opens only into a running job."],
  ] as const)("offers no terminal into a %s job, and says why", (status, why) => {
    const { grants } = renderPanel({ job: makeJob({ status }) });
    expect(screen.getByRole("status")).toHaveTextContent(why);
    expect(screen.queryByRole("button", { name: /New terminal/ })).toBeNull();
    expect(grants).toHaveLength(0);
  });
});

describe("the run page's Terminal tab", () => {
  function renderRunPage(run: Run) {
    const posts: string[] = [];
    vi.stubGlobal(
      "fetch",
      vi.fn(async (url: string, init: RequestInit = {}) => {
        if (init.method === "POST") {
          posts.push(url);
          return new Response(JSON.stringify({ id: "session-1", kind: "terminal" }), { status: 201 });
        }
        if (url.includes("/logs/")) return new Response(JSON.stringify({ lines: [], has_more: false, last_seq: 0 }));
        return new Response(JSON.stringify(run));
      }),
    );
    const live: SocketLike = { onopen: null, onmessage: null, onclose: null, onerror: null, close() {} };
    const relay: FakeRelaySocket[] = [];
    render(
      <SocketFactoryContext.Provider value={() => live}>
        <RelaySocketFactoryContext.Provider value={(url) => (relay.push(new FakeRelaySocket(url)), relay[relay.length - 1])}>
          <WorkspaceContext.Provider value={workspaceState({ slug: "acme", name: "Acme", role: "member" }, [], async () => {})}>
            <MemoryRouter initialEntries={[`/w/acme/runs/${run.name}`]}>
              <Routes>
                <Route path="/w/acme/runs/:run" element={<RunPage />} />
              </Routes>
            </MemoryRouter>
          </WorkspaceContext.Provider>
        </RelaySocketFactoryContext.Provider>
      </SocketFactoryContext.Provider>,
    );
    return { posts, relay };
  }

  it("opens a terminal into the running job, which lives on under the Logs tab", async () => {
    const { posts, relay } = renderRunPage({ ...makeRun([makeJob()]), last_seq: 0 } as Run);
    const views = await screen.findByRole("tablist", { name: "Run views" });
    expect(within(views).getAllByRole("tab").map((t) => t.textContent)).toEqual(["Logs", "Metrics", "Artifacts", "Lineage", "Terminal"]);
    fireEvent.click(within(views).getByRole("tab", { name: "Terminal" }));
    await waitFor(() => expect(relay).toHaveLength(1));
    expect(posts).toEqual(["/api/v1/workspaces/acme/runs/run-1/sessions/"]);
    relay[0].accept();

    fireEvent.click(within(views).getByRole("tab", { name: "Logs" }));
    expect(screen.getByRole("log", { name: "Logs of train" })).toBeInTheDocument();
    expect(relay[0].closedWith).toBeNull();
    fireEvent.click(within(views).getByRole("tab", { name: "Terminal" }));
    expect(screen.getByRole("tab", { name: "train 1" })).toHaveAttribute("aria-selected", "true");
    expect(posts).toHaveLength(1);
  });

  it("has no Terminal tab once the run has finished", async () => {
    renderRunPage({ ...makeRun([makeJob({ status: "succeeded" })]), status: "succeeded" } as Run);
    const views = await screen.findByRole("tablist", { name: "Run views" });
    expect(within(views).getAllByRole("tab").map((t) => t.textContent)).toEqual(["Logs", "Metrics", "Artifacts", "Lineage"]);
  });
});

describe("RelayConnection", () => {
  let now = 0;
  let sockets: FakeRelaySocket[];
  let phases: RelayPhase[];
  let connection: RelayConnection;

  beforeEach(() => {
    vi.useFakeTimers();
    now = 0;
    sockets = [];
    phases = [];
    const factory = (url: string) => (sockets.push(new FakeRelaySocket(url)), sockets[sockets.length - 1]);
    connection = new RelayConnection("s-1", { onBytes: () => undefined, onPhase: (p) => phases.push(p) }, factory, () => now);
    connection.start();
  });

  it("gives up when the socket stays away for the whole grace", () => {
    sockets[0].accept();
    for (let i = 0; now < RECONNECT_WINDOW_MS; i += 1) {
      sockets[sockets.length - 1].drop(1006);
      now += 3_000;
      act(() => vi.advanceTimersByTime(3_000));
    }
    sockets[sockets.length - 1].drop(1006);
    expect(phases[phases.length - 1]).toEqual({ phase: "ended", reason: "the connection dropped and did not come back within 30 s" });
    const count = sockets.length;
    act(() => vi.advanceTimersByTime(10_000));
    expect(sockets).toHaveLength(count);
  });

  it("stops reconnecting when the server answers that the session is gone", () => {
    sockets[0].accept();
    sockets[0].drop(1006);
    act(() => vi.advanceTimersByTime(250));
    sockets[1].drop(4404);
    expect(phases[phases.length - 1]).toEqual({
      phase: "ended",
      reason: "the session is gone (it ended, or was not used in time): open a new terminal",
    });
  });

  it("says the server's reason for a refusal, and retries a 4403 only while reconnecting", () => {
    sockets[0].accept();
    sockets[0].drop(1006);
    act(() => vi.advanceTimersByTime(250));
    sockets[1].drop(4403, "the session has a client already");
    expect(phases[phases.length - 1]).toEqual({ phase: "reconnecting", attempt: 2 });
    act(() => vi.advanceTimersByTime(500));
    sockets[2].drop(4404, "the session has ended: the job's attempt ended");
    expect(phases[phases.length - 1]).toEqual({ phase: "ended", reason: "the session has ended: the job's attempt ended" });

    const first = new RelayConnection("s-2", { onBytes: () => undefined, onPhase: (p) => phases.push(p) }, (url) => (sockets.push(new FakeRelaySocket(url)), sockets[sockets.length - 1]));
    first.start();
    sockets[sockets.length - 1].drop(4403);
    expect(phases[phases.length - 1]).toEqual({ phase: "ended", reason: "you may not open a terminal in this job" });
  });

  it("splits a large paste into frames of at most 64 KiB and drops input while disconnected", () => {
    sockets[0].accept();
    connection.sendText("x".repeat(150 * 1024));
    expect(sockets[0].sent.map((f) => f.length)).toEqual([65536, 65536, 22528]);
    sockets[0].drop(1006);
    connection.sendText("lost");
    expect(sockets[0].sent).toHaveLength(3);
  });
});
