import { render, screen, within } from "@testing-library/react";
import { MemoryRouter } from "react-router-dom";
import { describe, expect, it } from "vitest";
import type { Reproduced, Run } from "../api/types";
import { RerunBadge } from "../components/RerunBadge";

function makeRun(overrides: Partial<Run>): Run {
  return {
    id: "id-2",
    name: "brave-otter-2",
    workflow: "train",
    status: "succeeded",
    status_reason: "",
    exit_code: 0,
    created_at: "2026-01-05T10:00:00Z",
    started_at: "2026-01-05T10:00:01Z",
    finished_at: "2026-01-05T10:01:00Z",
    duration_seconds: 59,
    code: { kind: "git" },
    jobs: [],
    ...overrides,
  };
}

function renderBadge(run: Run) {
  return render(
    <MemoryRouter>
      <RerunBadge run={run} workspace="acme" />
    </MemoryRouter>,
  );
}

function difference(job: string, path: string, files: string[]): Reproduced["differences"][number] {
  return { job, path, files, more_files: 0, only_in: "", text: `${job} ${path} (${files.join(", ")})` };
}

describe("RerunBadge", () => {
  it("links a reproduced re-run to its original with a green badge and says what was compared", () => {
    const detail = "every artifact byte-identical (3 files)";
    renderBadge(makeRun({ rerun_of: "brave-otter-1", reproduced: { state: "reproduced", detail, differences: [] } }));

    expect(screen.getByText(/Re-run of/)).toHaveTextContent("Re-run of brave-otter-1");
    expect(screen.getByRole("link", { name: "brave-otter-1" })).toHaveAttribute("href", "/w/acme/runs/brave-otter-1");
    const badge = screen.getByText("reproduced");
    expect(badge).toHaveClass("badge", "badge-reproduced");
    expect(badge).toHaveAttribute("title", detail);
    expect(screen.getByText(detail)).toHaveClass("muted");
    expect(screen.queryByRole("list")).toBeNull();
  });

  it("lists the artifacts that differ, five at most", () => {
    const differences = ["a", "b", "c", "d", "e", "f", "g"].map((job) => difference(job, "./model", ["m.bin"]));
    const detail = "a ./model (m.bin); b ./model (m.bin); …";
    renderBadge(makeRun({ rerun_of: "brave-otter-1", reproduced: { state: "differs", detail, differences } }));

    expect(screen.getByText("differs")).toHaveClass("badge-differs");
    const list = screen.getByRole("list", { name: "Artifacts that differ" });
    expect(within(list).getAllByRole("listitem").map((li) => li.textContent)).toEqual([
      "a ./model (m.bin)",
      "b ./model (m.bin)",
      "c ./model (m.bin)",
      "d ./model (m.bin)",
      "e ./model (m.bin)",
      "and 2 more",
    ]);
  });

  it("says why a re-run is not comparable", () => {
    const detail = "every job was reused from the cache (nothing ran again)";
    renderBadge(makeRun({ rerun_of: "brave-otter-1", reproduced: { state: "not_comparable", detail, differences: [] } }));

    expect(screen.getByText("not comparable")).toHaveClass("badge-not_comparable");
    expect(screen.getByText(detail)).toBeInTheDocument();
  });

  it("shows nothing for a run that is no re-run", () => {
    const { container } = renderBadge(makeRun({ rerun_of: null, reproduced: null }));

    expect(container).toBeEmptyDOMElement();
  });
});
