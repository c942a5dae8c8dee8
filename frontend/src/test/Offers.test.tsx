import { fireEvent, render, screen, waitFor } from "@testing-library/react";
import { MemoryRouter } from "react-router-dom";
import { afterEach, describe, expect, it, vi } from "vitest";
import type { Offer } from "../api/types";
import { OffersPage } from "../pages/Offers";
import { WorkspaceContext, workspaceState } from "../workspace";

const GIB = 2 ** 30;

function offer(overrides: Partial<Offer>): Offer {
  return {
    offer_id: "aws/us-east-1/us-east-1a/g5.xlarge/spot",
    backend: "aws",
    account: "aws",
    region: "us-east-1",
    zone: "us-east-1a",
    instance_type: "g5.xlarge",
    spot: true,
    price_per_hour: 0.35,
    cpus: 4,
    memory_bytes: 16 * GIB,
    disk_bytes: 0,
    gpus: [{ name: "NVIDIA A10G", memory_bytes: 24 * GIB }],
    catalog_date: "2026-11-01",
    ...overrides,
  };
}

afterEach(() => vi.unstubAllGlobals());

describe("OffersPage", () => {
  it("shows offers in the server's order with the catalog date, and filters by GPU and memory", async () => {
    const urls: string[] = [];
    const offers = [offer({}), offer({ offer_id: "x", spot: false, price_per_hour: 1.006, zone: "" })];
    vi.stubGlobal(
      "fetch",
      vi.fn(async (url: string) => {
        urls.push(url);
        return new Response(JSON.stringify({ offers, shortfall: "", accounts: 1 }));
      }),
    );
    render(
      <WorkspaceContext.Provider value={workspaceState({ slug: "acme", name: "Acme", role: "viewer" }, [], async () => {})}>
        <MemoryRouter>
          <OffersPage />
        </MemoryRouter>
      </WorkspaceContext.Provider>,
    );

    const rows = await screen.findAllByRole("row");
    expect(rows[1].textContent).toContain("$0.3500");
    expect(rows[1].textContent).toContain("spot");
    expect(rows[1].textContent).toContain("1× NVIDIA A10G");
    expect(rows[2].textContent).toContain("on-demand");
    expect(screen.getByText("Prices from the catalog of 2026-11-01.")).toBeTruthy();

    fireEvent.change(screen.getByLabelText("GPU"), { target: { value: "A10G" } });
    fireEvent.change(screen.getByLabelText("Memory"), { target: { value: "16GB" } });
    fireEvent.change(screen.getByLabelText("Market"), { target: { value: "spot" } });
    fireEvent.click(screen.getByRole("button", { name: "Show offers" }));

    await waitFor(() => expect(urls.at(-1)).toBe("/api/v1/workspaces/acme/offers/?gpu=A10G&memory=16GB&spot_policy=spot"));
  });

  it("says why nothing fits", async () => {
    vi.stubGlobal("fetch", vi.fn(async () => new Response(JSON.stringify({ offers: [], shortfall: "aws g5.xlarge: 1× H100 requested", accounts: 1 }))));
    render(
      <WorkspaceContext.Provider value={workspaceState({ slug: "acme", name: "Acme", role: "viewer" }, [], async () => {})}>
        <MemoryRouter>
          <OffersPage />
        </MemoryRouter>
      </WorkspaceContext.Provider>,
    );

    expect(await screen.findByText("No offer fits")).toBeTruthy();
    expect(screen.getByText("aws g5.xlarge: 1× H100 requested")).toBeTruthy();
  });
});
