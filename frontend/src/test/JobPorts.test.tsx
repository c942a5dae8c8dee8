import { render, screen } from "@testing-library/react";
import { describe, expect, it } from "vitest";
import type { Job } from "../api/types";
import { JobPorts } from "../components/JobPorts";

function makeJob(overrides: Partial<Job>): Job {
  return { id: "j1", name: "train", status: "running", ports: [8888, 6006], ...overrides } as Job;
}

describe("JobPorts", () => {
  it("gives a member an Open link per port of a running job, to the server's /open/ path, in a new tab", () => {
    render(<JobPorts job={makeJob({})} run="brave-otter-2" workspace="acme" canOpen />);

    const open = screen.getByRole("link", { name: "Open port 8888 of train in a new tab" });
    expect(open).toHaveAttribute("href", "/open/acme/brave-otter-2/train/8888/");
    expect(open).toHaveAttribute("target", "_blank");
    expect(open).toHaveAttribute("rel", "noopener noreferrer");
    expect(screen.getByRole("link", { name: "Open port 6006 of train in a new tab" })).toHaveAttribute(
      "href",
      "/open/acme/brave-otter-2/train/6006/",
    );
  });

  it("lists the ports without links for a viewer, and while the job is only assigned", () => {
    const { rerender } = render(<JobPorts job={makeJob({})} run="r" workspace="acme" canOpen={false} />);
    expect(screen.getByText("8888")).toBeInTheDocument();
    expect(screen.queryByRole("link")).toBeNull();

    rerender(<JobPorts job={makeJob({ status: "assigned" })} run="r" workspace="acme" canOpen />);
    expect(screen.getByText("6006")).toBeInTheDocument();
    expect(screen.queryByRole("link")).toBeNull();
  });

  it("shows nothing once the job has ended", () => {
    const { container } = render(<JobPorts job={makeJob({ status: "succeeded" })} run="r" workspace="acme" canOpen />);
    expect(container).toBeEmptyDOMElement();
  });
});
