import { act, fireEvent, render, screen, within } from "@testing-library/react";
import { MemoryRouter } from "react-router-dom";
import { afterEach, describe, expect, it, vi } from "vitest";
import { SocketFactoryContext, type SocketLike } from "../api/live";
import type { Run } from "../api/types";
import { RunsPage } from "../pages/Runs";
import { WorkspaceContext, workspaceState } from "../workspace";

function makeRun(overrides: Partial<Run>): Run {
  return {
    id: "id-1",
    name: "brave-otter-1",
    workflow: "train",
    status: "running",
    status_reason: "",
    exit_code: null,
    submitted_by: "alice",
    created_at: new Date(Date.now() - 5 * 60_000).toISOString(),
    started_at: new Date(Date.now() - 4 * 60_000).toISOString(),
    finished_at: null,
    duration_seconds: null,
    code: { kind: "git", repo_url: "https://github.com/acme/models.git", commit: "0123456789abcdef0123456789abcdef01234567", has_patch: false },
    jobs: [],
    tags: [],
    ...overrides,
  };
}

class FakeSocket implements SocketLike {
  onopen: SocketLike["onopen"] = null;
  onmessage: SocketLike["onmessage"] = null;
  onclose: SocketLike["onclose"] = null;
  onerror: SocketLike["onerror"] = null;
  closed = false;
  constructor(readonly url: string) {}
  close() {
    this.closed = true;
  }
  send(frame: unknown) {
    act(() => this.onmessage?.(new MessageEvent("message", { data: JSON.stringify(frame) })));
  }
}

function renderRuns(runs: Run[]) {
  const sockets: FakeSocket[] = [];
  const fetchMock = vi.fn(async () => new Response(JSON.stringify({ count: runs.length, next: null, previous: null, results: runs })));
  vi.stubGlobal("fetch", fetchMock);
  const workspace = workspaceState({ slug: "acme", name: "Acme", role: "member" }, [], async () => {});
  render(
    <SocketFactoryContext.Provider value={(url) => (sockets.push(new FakeSocket(url)), sockets[sockets.length - 1])}>
      <WorkspaceContext.Provider value={workspace}>
        <MemoryRouter initialEntries={["/w/acme/runs"]}>
          <RunsPage />
        </MemoryRouter>
      </WorkspaceContext.Provider>
    </SocketFactoryContext.Provider>,
  );
  return { sockets, fetchMock };
}

afterEach(() => vi.unstubAllGlobals());

describe("RunsPage", () => {
  it("lists runs with status badges, code, cost and tags", async () => {
    renderRuns([
      makeRun({}),
      makeRun({ id: "id-2", name: "calm-heron-2", status: "failed", duration_seconds: 75, tags: ["base"], code: { kind: "archive" } }),
    ]);
    const row = (await screen.findByRole("link", { name: "brave-otter-1" })).closest("tr") as HTMLElement;
    expect(within(row).getByText("running")).toHaveAttribute("data-status", "running");
    expect(within(row).getByText("acme/models@0123456")).toBeInTheDocument();
    expect(within(row).getByText("alice")).toBeInTheDocument();
    expect(within(row).getByText("5 minutes ago")).toBeInTheDocument();
    expect(within(row).getByRole("link", { name: "brave-otter-1" })).toHaveAttribute("href", "/w/acme/runs/brave-otter-1");

    const failed = screen.getByRole("link", { name: "calm-heron-2" }).closest("tr") as HTMLElement;
    expect(within(failed).getByText("failed")).toHaveClass("badge-failed");
    expect(within(failed).getByText("1m 15s")).toBeInTheDocument();
    expect(within(failed).getByText("—", { selector: "td" })).toBeInTheDocument();
    expect(within(failed).getByRole("link", { name: "base" })).toBeInTheDocument();
    expect(screen.getAllByRole("row")).toHaveLength(3);
  });

  it("says which runs only built an environment (trainyard env build)", async () => {
    renderRuns([makeRun({}), makeRun({ id: "id-2", name: "calm-heron-2", environment_build: true })]);
    const build = (await screen.findByRole("link", { name: "calm-heron-2" })).closest("tr") as HTMLElement;
    expect(within(build).getByText("(environment build)")).toBeInTheDocument();
    const plain = screen.getByRole("link", { name: "brave-otter-1" }).closest("tr") as HTMLElement;
    expect(within(plain).queryByText("(environment build)")).toBeNull();
  });

  it("updates a row and adds new runs from websocket frames without reloading", async () => {
    const { sockets, fetchMock } = renderRuns([makeRun({})]);
    await screen.findByRole("link", { name: "brave-otter-1" });
    expect(sockets).toHaveLength(1);
    expect(sockets[0].url).toBe(`ws://${window.location.host}/ws/v1/workspaces/acme/runs/`);

    sockets[0].send({ type: "run", run: makeRun({ status: "succeeded", exit_code: 0, duration_seconds: 42, finished_at: new Date().toISOString() }) });
    const row = screen.getByRole("link", { name: "brave-otter-1" }).closest("tr") as HTMLElement;
    expect(within(row).getByText("succeeded")).toHaveClass("badge-succeeded");
    expect(within(row).queryByText("running")).toBeNull();
    expect(within(row).getByText("42s")).toBeInTheDocument();

    sockets[0].send({ type: "run", run: makeRun({ id: "id-3", name: "quick-lynx-3", status: "pending", started_at: null }) });
    const rows = screen.getAllByRole("row");
    expect(rows).toHaveLength(3);
    expect(within(rows[1]).getByRole("link", { name: "quick-lynx-3" })).toBeInTheDocument();
    expect(screen.getByText("1–2 of 2")).toBeInTheDocument();
    expect(fetchMock).toHaveBeenCalledTimes(1);
  });

  it("teaches a new user the commands when the workspace has no runs, installing the CLI first", async () => {
    renderRuns([]);
    expect(await screen.findByRole("heading", { name: "Start your first run" })).toBeInTheDocument();
    const commands = within(screen.getByRole("list")).getAllByRole("listitem");
    expect(commands[0]).toHaveTextContent(`pip install --extra-index-url ${window.location.origin}/cli/wheels/ trainyard-cli`);
    expect(screen.getByText(`export TRAINYARD_URL=${window.location.origin}`)).toBeInTheDocument();
    expect(screen.getByText("export TRAINYARD_TOKEN=<make one on the API tokens page>")).toBeInTheDocument();
    expect(screen.getByText("trainyard run hello")).toBeInTheDocument();
    expect(screen.getByRole("link", { name: "API tokens" })).toHaveAttribute("href", "/w/acme/tokens");
  });

  it("pages by the cursor of the next link and says when the count is an estimate", async () => {
    const newest = makeRun({ id: "id-a", name: "newest-run-9" });
    const older = makeRun({ id: "id-b", name: "older-run-1" });
    const fetchMock = vi.fn(async (url: string) => {
      const cursor = new URL(url, window.location.origin).searchParams.get("cursor");
      const body = cursor
        ? { count: 1_000_000, count_estimated: true, next: null, previous: null, results: [older] }
        : { count: 1_000_000, count_estimated: true, next: "http://x/api/v1/workspaces/acme/runs/?cursor=c2&page_size=25", previous: null, results: [newest] };
      return new Response(JSON.stringify(body));
    });
    vi.stubGlobal("fetch", fetchMock);
    const workspace = workspaceState({ slug: "acme", name: "Acme", role: "member" }, [], async () => {});
    render(
      <SocketFactoryContext.Provider value={(url) => new FakeSocket(url)}>
        <WorkspaceContext.Provider value={workspace}>
          <MemoryRouter initialEntries={["/w/acme/runs"]}>
            <RunsPage />
          </MemoryRouter>
        </WorkspaceContext.Provider>
      </SocketFactoryContext.Provider>,
    );
    await screen.findByRole("link", { name: "newest-run-9" });
    expect(screen.getByText("1–1 of about 1,000,000")).toBeInTheDocument();
    expect(screen.getByRole("button", { name: "Previous" })).toBeDisabled();

    fireEvent.click(screen.getByRole("button", { name: "Next" }));
    await screen.findByRole("link", { name: "older-run-1" });
    expect(String(fetchMock.mock.calls[1][0])).toContain("cursor=c2");
    expect(screen.getByText("Page 2")).toBeInTheDocument();
    expect(screen.getByText("26–26 of about 1,000,000")).toBeInTheDocument();
    expect(screen.getByRole("button", { name: "Next" })).toBeDisabled();

    fireEvent.click(screen.getByRole("button", { name: "Previous" }));
    await screen.findByRole("link", { name: "newest-run-9" });
    expect(String(fetchMock.mock.calls[2][0])).not.toContain("cursor=");
  });
});
