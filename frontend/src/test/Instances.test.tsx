import { render, screen } from "@testing-library/react";
import { MemoryRouter } from "react-router-dom";
import { afterEach, describe, expect, it, vi } from "vitest";
import type { Instance } from "../api/types";
import { InstancesPage } from "../pages/Instances";
import { WorkspaceContext, workspaceState } from "../workspace";

function instance(overrides: Partial<Instance>): Instance {
  return {
    id: "2b1c7a9e-0000-4000-8000-000000000001",
    name: "aws-147fe36c",
    backend: "aws",
    account: "aws",
    backend_id: "i-0abc123",
    instance_type: "c6i.large",
    region: "us-east-1",
    zone: "",
    spot: true,
    price_per_hour: 0.034,
    status: "busy",
    status_reason: "",
    hostname: "ip-10-0-0-1",
    address: "",
    cpus: 2,
    memory_bytes: 4 * 2 ** 30,
    gpus: [],
    current_job: { run: "tough-ocelot-1", job: "j1", job_name: "finetune-model" },
    created_at: new Date(Date.now() - 60_000).toISOString(),
    last_heartbeat_at: new Date().toISOString(),
    uptime_seconds: 60,
    cloud_state: "running",
    cloud_checked_at: new Date().toISOString(),
    ...overrides,
  } as Instance;
}

afterEach(() => vi.unstubAllGlobals());

describe("InstancesPage", () => {
  it("shows each machine's cloud id, type, market, price and the cloud's own view beside ours", async () => {
    const machines = [instance({}), instance({ id: "x", name: "aws-2", cloud_state: "", cloud_checked_at: null })];
    vi.stubGlobal("fetch", vi.fn(async () => new Response(JSON.stringify(machines))));
    render(
      <WorkspaceContext.Provider value={workspaceState({ slug: "acme", name: "Acme", role: "viewer" }, [], async () => {})}>
        <MemoryRouter>
          <InstancesPage />
        </MemoryRouter>
      </WorkspaceContext.Provider>,
    );

    const rows = await screen.findAllByRole("row");
    expect(rows[1].textContent).toContain("i-0abc123");
    expect(rows[1].textContent).toContain("c6i.large");
    expect(rows[1].textContent).toContain("us-east-1 · spot");
    expect(rows[1].textContent).toContain("$0.0340");
    expect(rows[1].textContent).toContain("cloud: running");
    expect(rows[2].textContent).not.toContain("cloud:");
  });
});
