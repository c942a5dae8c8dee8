import { fireEvent, render, screen, waitFor, within } from "@testing-library/react";
import { MemoryRouter } from "react-router-dom";
import { afterEach, describe, expect, it, vi } from "vitest";
import type { SshKey } from "../api/types";
import { SshKeysPage } from "../pages/SshKeys";

const LINE = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIBtOe0TxQVSC5KoermSUTLy0wfYWTO+ew2aN8Sfk9jsd";

function key(overrides: Partial<SshKey>): SshKey {
  return {
    id: "k-1",
    name: "olivia@laptop",
    public_key: LINE,
    fingerprint: "SHA256:0Ux0lvmUj40wRtqr93/MkDhs7Ix5y7eNldRc7mPb/S8",
    created_at: new Date().toISOString(),
    last_used_at: null,
    ...overrides,
  };
}

type Call = { method: string; url: string; body: unknown };

function serve(lists: SshKey[][], answers: Record<string, Response> = {}) {
  const calls: Call[] = [];
  let listed = 0;
  vi.stubGlobal(
    "fetch",
    vi.fn(async (url: string, init: RequestInit = {}) => {
      const method = init.method ?? "GET";
      calls.push({ method, url, body: init.body ? JSON.parse(String(init.body)) : undefined });
      const answer = answers[`${method} ${url}`];
      if (answer) return answer.clone();
      if (method === "DELETE") return new Response(null, { status: 204 });
      if (method === "POST") return new Response(JSON.stringify(key({})), { status: 201 });
      return new Response(JSON.stringify(lists[Math.min(listed++, lists.length - 1)]));
    }),
  );
  return calls;
}

function renderPage() {
  render(
    <MemoryRouter>
      <SshKeysPage />
    </MemoryRouter>,
  );
}

afterEach(() => vi.unstubAllGlobals());

describe("SshKeysPage", () => {
  it("lists the keys with their fingerprint and type", async () => {
    serve([[key({}), key({ id: "k-2", name: "ci", public_key: "ecdsa-sha2-nistp256 AAAA", fingerprint: "SHA256:abc" })]]);
    renderPage();

    const first = (await screen.findByText("olivia@laptop")).closest("tr")!;
    expect(within(first).getByText("SHA256:0Ux0lvmUj40wRtqr93/MkDhs7Ix5y7eNldRc7mPb/S8")).toBeTruthy();
    expect(within(first).getByText("ssh-ed25519")).toBeTruthy();
    expect(within(first).getByText("never")).toBeTruthy();
    expect(within(screen.getByText("ci").closest("tr")!).getByText("ecdsa-sha2-nistp256")).toBeTruthy();
  });

  it("adds a pasted key and shows the new list", async () => {
    const calls = serve([[], [key({ name: "work" })]]);
    renderPage();
    expect(await screen.findByText("No SSH keys yet")).toBeTruthy();

    fireEvent.change(screen.getByLabelText("Public key"), { target: { value: `${LINE} olivia@laptop\n` } });
    fireEvent.change(screen.getByLabelText("Name"), { target: { value: " work " } });
    fireEvent.click(screen.getByRole("button", { name: "Add key" }));

    expect(await screen.findByText("work")).toBeTruthy();
    expect(calls.find((c) => c.method === "POST")).toEqual({
      method: "POST",
      url: "/api/v1/me/ssh-keys/",
      body: { public_key: `${LINE} olivia@laptop\n`, name: "work" },
    });
    expect((screen.getByLabelText("Public key") as HTMLTextAreaElement).value).toBe("");
  });

  it("shows the server's refusal of a private key and keeps what was typed", async () => {
    serve([[]], {
      "POST /api/v1/me/ssh-keys/": new Response(
        JSON.stringify({ message: "This is a PRIVATE key: it was not stored, and it should never leave your machine.", extra: {} }),
        { status: 400 },
      ),
    });
    renderPage();
    const pasted = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3Blbn\n-----END OPENSSH PRIVATE KEY-----";
    fireEvent.change(await screen.findByLabelText("Public key"), { target: { value: pasted } });
    fireEvent.click(screen.getByRole("button", { name: "Add key" }));

    expect(await screen.findByText(/This is a PRIVATE key: it was not stored/)).toBeTruthy();
    expect((screen.getByLabelText("Public key") as HTMLTextAreaElement).value).toBe(pasted);
  });

  it("removes a key after confirming", async () => {
    const calls = serve([[key({})], []]);
    renderPage();

    fireEvent.click(await screen.findByRole("button", { name: "Remove" }));
    fireEvent.click(screen.getByRole("button", { name: "Remove olivia@laptop" }));

    expect(await screen.findByText("No SSH keys yet")).toBeTruthy();
    await waitFor(() => expect(calls.filter((c) => c.method === "DELETE").map((c) => c.url)).toEqual(["/api/v1/me/ssh-keys/k-1/"]));
  });
});
