import { render, screen, waitFor, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { afterEach, describe, expect, it, vi } from "vitest";
import type { Artifact, Job } from "../api/types";
import { ArtifactsBrowser, buildTree, parseCsv } from "../components/ArtifactsBrowser";

const SHA = "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08";

const job = { id: "job-1", name: "train" } as Job;
const artifact: Artifact = {
  id: "art-1",
  job: "job-1",
  path: "./model",
  status: "complete",
  total_size: 3 * 1024 * 1024 + 1536 + 40,
  files: [
    { path: "checkpoints/epoch-2/weights.bin", size: 2 * 1024 * 1024, sha256: SHA },
    { path: "metrics.csv", size: 40, sha256: SHA },
    { path: "checkpoints/epoch-1/weights.bin", size: 1024 * 1024, sha256: SHA },
    { path: "config.json", size: 1536, sha256: SHA },
  ],
};

afterEach(() => vi.unstubAllGlobals());

describe("buildTree", () => {
  it("makes folders from the paths, folders first, with summed sizes", () => {
    const root = buildTree(artifact.files);
    expect(root.children.map((c) => `${c.kind}:${c.name}`)).toEqual(["dir:checkpoints", "file:config.json", "file:metrics.csv"]);
    const checkpoints = root.children[0];
    expect(checkpoints.kind === "dir" && checkpoints.path).toBe("checkpoints/");
    expect(checkpoints.kind === "dir" && checkpoints.size).toBe(3 * 1024 * 1024);
    expect(checkpoints.kind === "dir" && checkpoints.children.map((c) => c.name)).toEqual(["epoch-1", "epoch-2"]);
  });

  it("parses quoted CSV fields", () => {
    expect(parseCsv('a,b\n1,"x, ""y"""\n')).toEqual([["a", "b"], ["1", 'x, "y"']]);
  });
});

describe("ArtifactsBrowser", () => {
  it("shows the folder tree with human sizes, short hashes and archive links", async () => {
    render(<ArtifactsBrowser workspace="team" artifacts={[artifact]} jobs={[job]} />);
    expect(screen.getByRole("heading", { name: "train" })).toBeInTheDocument();
    const folder = screen.getByRole("button", { name: /checkpoints\// });
    expect(folder).toHaveAttribute("aria-expanded", "true");
    expect(within(folder.parentElement as HTMLElement).getByText("3.0 MB")).toBeInTheDocument();
    expect(screen.getByRole("link", { name: "Download folder checkpoints/" })).toHaveAttribute(
      "href",
      "/api/v1/workspaces/team/artifacts/art-1/archive/?prefix=checkpoints%2F",
    );
    expect(screen.getByRole("link", { name: "Download all" })).toHaveAttribute("href", "/api/v1/workspaces/team/artifacts/art-1/archive/");

    const config = screen.getByRole("button", { name: "config.json" }).closest("li") as HTMLElement;
    expect(within(config).getByText("1.5 KB")).toBeInTheDocument();
    expect(within(config).getByText(SHA.slice(0, 10))).toBeInTheDocument();
    expect(within(config).getByRole("button", { name: `Copy sha256: ${SHA}` })).toBeInTheDocument();

    await userEvent.click(folder);
    expect(folder).toHaveAttribute("aria-expanded", "false");
    expect(screen.queryByRole("button", { name: "epoch-1/" })).toBeNull();
  });

  it("previews a CSV file as a table when it is selected", async () => {
    const fetchMock = vi.fn(async () => new Response("step,loss\n1,0.9\n2,0.5\n"));
    vi.stubGlobal("fetch", fetchMock);
    render(<ArtifactsBrowser workspace="team" artifacts={[artifact]} jobs={[job]} />);
    expect(fetchMock).not.toHaveBeenCalled();

    await userEvent.click(screen.getByRole("button", { name: "metrics.csv" }));
    expect(fetchMock).toHaveBeenCalledWith("/api/v1/workspaces/team/artifacts/art-1/files/metrics.csv", expect.objectContaining({ credentials: "same-origin" }));
    const preview = screen.getByRole("region", { name: "Preview" });
    expect(await within(preview).findByRole("columnheader", { name: "loss" })).toBeInTheDocument();
    expect(within(preview).getByRole("cell", { name: "0.5" })).toBeInTheDocument();
    expect(within(preview).getByRole("link", { name: "Download" })).toHaveAttribute("href", "/api/v1/workspaces/team/artifacts/art-1/files/metrics.csv");
  });

  it("pretty-prints JSON and does not fetch binary files", async () => {
    const fetchMock = vi.fn(async () => new Response('{"lr":0.001,"layers":[1,2]}'));
    vi.stubGlobal("fetch", fetchMock);
    render(<ArtifactsBrowser workspace="team" artifacts={[artifact]} jobs={[job]} />);

    await userEvent.click(screen.getByRole("button", { name: "config.json" }));
    const preview = screen.getByRole("region", { name: "Preview" });
    await waitFor(() => expect(preview.querySelector("pre")?.textContent).toBe('{\n  "lr": 0.001,\n  "layers": [\n    1,\n    2\n  ]\n}'));

    fetchMock.mockClear();
    await userEvent.click(screen.getAllByRole("button", { name: "weights.bin" })[0]);
    expect(within(preview).getByText(/No preview for this file type/)).toBeInTheDocument();
    expect(fetchMock).not.toHaveBeenCalled();
  });

  it("shows an image from a blob of its bytes, typed by its extension (storage sends every file as an octet-stream)", async () => {
    const svg = '<svg xmlns="http://www.w3.org/2000/svg"/>';
    const fetchMock = vi.fn(async () => new Response(svg, { headers: { "Content-Type": "application/octet-stream" } }));
    vi.stubGlobal("fetch", fetchMock);
    const blobs: Blob[] = [];
    const createObjectURL = vi.fn((blob: Blob) => {
      blobs.push(blob);
      return "blob:preview-1";
    });
    // jsdom has no object URLs: a URL class that records the blobs it is given.
    vi.stubGlobal("URL", class extends URL {
      static createObjectURL = createObjectURL;
      static revokeObjectURL = vi.fn();
    });
    const withImage = { ...artifact, files: [...artifact.files, { path: "plots/loss.svg", size: svg.length, sha256: SHA }] };
    render(<ArtifactsBrowser workspace="team" artifacts={[withImage]} jobs={[job]} />);

    await userEvent.click(screen.getByRole("button", { name: "loss.svg" }));
    const preview = screen.getByRole("region", { name: "Preview" });
    const img = await within(preview).findByRole("img", { name: "plots/loss.svg" });
    expect(img).toHaveAttribute("src", "blob:preview-1");
    expect(fetchMock).toHaveBeenCalledWith("/api/v1/workspaces/team/artifacts/art-1/files/plots/loss.svg", expect.objectContaining({ credentials: "same-origin" }));
    expect(blobs.map((blob) => blob.type)).toEqual(["image/svg+xml"]);
    expect(await blobs[0].text()).toBe(svg);
  });
});

describe("an artifact's copy to its to:", () => {
  const exported = (status: "pending" | "copying" | "done" | "failed", error = ""): Artifact => ({
    ...artifact,
    export: {
      id: "exp-1",
      job: "job-1",
      job_name: "train",
      path: "./model",
      artifact: "art-1",
      destination: "s3://acme-models/brave-otter-3/",
      status,
      attempts: error ? 2 : 1,
      error,
      next_attempt_at: null,
      done_at: null,
      objects_copied: 4,
      bytes_copied: 0,
      method: "server-side",
    },
  });

  it.each([
    [exported("done"), "→ s3://acme-models/brave-otter-3/ (copied)"],
    [exported("copying"), "→ s3://acme-models/brave-otter-3/ (copying)"],
    [exported("pending", "S3 refused PutObject: AccessDenied"), "(failed: S3 refused PutObject: AccessDenied, retrying)"],
    [exported("failed", "S3 refused PutObject: AccessDenied"), "(failed: S3 refused PutObject: AccessDenied)"],
  ])("shows where it goes and how far it got", (shown, text) => {
    render(<ArtifactsBrowser workspace="acme" artifacts={[shown]} jobs={[job]} />);
    expect(screen.getByText((_, el) => el?.classList.contains("artifact-export") === true).textContent).toContain(text);
  });
});
