import { fireEvent, render, screen, waitFor, within } from "@testing-library/react";
import { MemoryRouter } from "react-router-dom";
import { afterEach, describe, expect, it, vi } from "vitest";
import type { AwsSetup, Backend, Role } from "../api/types";
import { BackendsPage } from "../pages/Backends";
import { WorkspaceContext, workspaceState } from "../workspace";

const SETUP: AwsSetup = {
  external_id: "trainyard-0123456789abcdef0123456789abcdef",
  principal: "arn:aws:iam::111122223333:role/ty-server",
  installation: "ty-abc",
  prefix: "trainyard/",
  trust_policy: { Statement: [{ Condition: { StringEquals: { "sts:ExternalId": "trainyard-0123456789abcdef0123456789abcdef" } } }] },
  permission_policy: { Statement: [{ Sid: "TerminateOnlyOurMachines" }] },
};

function backend(overrides: Partial<Backend>): Backend {
  return {
    id: "b-1",
    name: "aws",
    kind: "aws",
    status: "active",
    status_reason: "",
    validated_at: new Date().toISOString(),
    created_at: new Date().toISOString(),
    auth: "keys",
    regions: ["us-east-1", "eu-west-1"],
    bucket: "my-artifacts",
    role_arn: "",
    external_id: "",
    aws_account_id: "123456789012",
    kubernetes: null,
    live_instances: 2,
    ...overrides,
  };
}

type Call = { method: string; url: string; body: unknown };

function serve(backends: Backend[], answers: Record<string, Response> = {}) {
  const calls: Call[] = [];
  vi.stubGlobal(
    "fetch",
    vi.fn(async (url: string, init: RequestInit = {}) => {
      const method = init.method ?? "GET";
      calls.push({ method, url, body: init.body ? JSON.parse(String(init.body)) : undefined });
      const answer = answers[`${method} ${url.split("?")[0]}`];
      if (answer) return answer.clone();
      if (url.includes("/backends/aws/setup/")) return new Response(JSON.stringify(SETUP));
      return new Response(JSON.stringify(backends));
    }),
  );
  return calls;
}

function renderPage(role: Role = "admin") {
  const workspace = workspaceState({ slug: "acme", name: "Acme", role }, [], async () => {});
  render(
    <WorkspaceContext.Provider value={workspace}>
      <MemoryRouter>
        <BackendsPage />
      </MemoryRouter>
    </WorkspaceContext.Provider>,
  );
}

afterEach(() => vi.unstubAllGlobals());

describe("BackendsPage", () => {
  it("lists accounts with their health and the last error", async () => {
    serve([backend({}), backend({ id: "b-2", name: "aws-eu", status: "broken", status_reason: "AWS rejected the access key AKIA…: InvalidClientTokenId" })]);
    renderPage();

    const broken = (await screen.findByText("aws-eu")).closest("tr")!;
    expect(within(broken).getByText("broken")).toBeTruthy();
    expect(within(broken).getByText(/InvalidClientTokenId/)).toBeTruthy();
    const first = screen.getAllByRole("row")[1];
    expect(within(first).getByText("us-east-1, eu-west-1")).toBeTruthy();
    expect(within(first).getByText("AWS account 123456789012")).toBeTruthy();
  });

  it("shows a Kubernetes backend's cluster, namespace and nodes, with Validate", async () => {
    const kubernetes = {
      namespace: "ml",
      context: "",
      cluster: "gke-prod",
      in_cluster: false,
      image: "",
      image_pull_secrets: [],
      node_selector: {},
      tolerations: [],
      prices: { "a2-highgpu-1g": 3.67 },
      spot_prices: null,
      default_price: null,
      node_pools: [],
      schedule_timeout_seconds: null,
      termination_grace_seconds: null,
      gpu_resource: "",
      nodes: 3,
      facts_refreshed_at: null,
    };
    serve([backend({ id: "b-3", name: "gke", kind: "kubernetes", auth: "kubeconfig", regions: ["gke-prod"], bucket: "", aws_account_id: "", kubernetes })]);
    renderPage();

    const row = (await screen.findByText("gke")).closest("tr")!;
    expect(within(row).getByText("namespace ml, 3 node(s)")).toBeTruthy();
    expect(within(row).getByText("gke-prod")).toBeTruthy();
    expect(within(row).getByRole("button", { name: "Validate" })).toBeTruthy();
  });

  it("shows the external id and both policies before connecting with a role", async () => {
    serve([]);
    renderPage();

    expect(await screen.findByText(SETUP.external_id)).toBeTruthy();
    expect(screen.getByText(SETUP.principal)).toBeTruthy();
    expect(screen.getByLabelText("Trust policy").textContent).toContain('"sts:ExternalId"');
    expect(screen.getByLabelText("Permission policy").textContent).toContain("TerminateOnlyOurMachines");
  });

  it("connects with keys and shows the server's message when a check fails", async () => {
    const calls = serve([], {
      "POST /api/v1/workspaces/acme/backends/": new Response(
        JSON.stringify({ message: "bucket my-artifacts does not exist (NoSuchBucket); create it", extra: { code: "NoSuchBucket" } }),
        { status: 400 },
      ),
    });
    renderPage();
    fireEvent.click(await screen.findByLabelText(/Access keys/));
    fireEvent.change(screen.getByLabelText("Regions"), { target: { value: "us-east-1, eu-west-1" } });
    fireEvent.change(screen.getByLabelText("Bucket"), { target: { value: "my-artifacts" } });
    fireEvent.change(screen.getByLabelText("Access key id"), { target: { value: "AKIAEXAMPLE" } });
    fireEvent.change(screen.getByLabelText("Secret access key"), { target: { value: "s3cret" } });
    fireEvent.click(screen.getByRole("button", { name: "Connect" }));

    expect(await screen.findByText(/bucket my-artifacts does not exist \(NoSuchBucket\)/)).toBeTruthy();
    const posted = calls.find((c) => c.method === "POST");
    expect(posted?.body).toEqual({
      kind: "aws",
      name: "aws",
      bucket: "my-artifacts",
      regions: ["us-east-1", "eu-west-1"],
      access_key_id: "AKIAEXAMPLE",
      secret_access_key: "s3cret",
    });
  });

  it("validates and removes from the row; remove is refused with the server's words", async () => {
    const calls = serve([backend({})], {
      "DELETE /api/v1/workspaces/acme/backends/aws/": new Response(
        JSON.stringify({ message: "Backend 'aws' still has 2 live instance(s): aws-1 (busy), aws-2 (idle).", extra: {} }),
        { status: 409 },
      ),
      "POST /api/v1/workspaces/acme/backends/aws/validate/": new Response(JSON.stringify(backend({}))),
    });
    renderPage();
    fireEvent.click(await screen.findByRole("button", { name: "Validate" }));
    expect(await screen.findByText("Backend aws passed every check.")).toBeTruthy();

    fireEvent.click(screen.getByRole("button", { name: "Remove" }));
    fireEvent.click(screen.getByRole("button", { name: "Remove backend aws" }));

    expect(await screen.findByText(/still has 2 live instance\(s\)/)).toBeTruthy();
    await waitFor(() => expect(calls.filter((c) => c.method === "DELETE")).toHaveLength(1));
  });

  it("shows neither the connect form nor actions to a member", async () => {
    serve([backend({})]);
    renderPage("member");

    expect(await screen.findByText("AWS account 123456789012")).toBeTruthy();
    expect(screen.queryByRole("button", { name: "Validate" })).toBeNull();
    expect(screen.queryByLabelText("Connect an AWS account")).toBeNull();
  });
});
