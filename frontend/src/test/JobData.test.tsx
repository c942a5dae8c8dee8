import { render, screen, within } from "@testing-library/react";
import { describe, expect, it } from "vitest";
import type { JobDataInput } from "../api/types";
import { JobDataFacts } from "../components/JobData";

const IMAGENET: JobDataInput = {
  uri: "s3://acme-data/imagenet/",
  path: "imagenet",
  read_only: true,
  file_count: 200,
  total_size: 1932735283,
  versioned: true,
};

function facts(job: Parameters<typeof JobDataFacts>[0]["job"]) {
  return render(
    <dl>
      <JobDataFacts job={job} />
    </dl>,
  );
}

describe("JobDataFacts", () => {
  it("lists each data input with its path and listing, and each volume where it is mounted", () => {
    facts({
      data_inputs: [
        IMAGENET,
        { uri: "https://example.com/vocab.txt", path: "vocab.txt", read_only: false, file_count: 1, total_size: 2048, versioned: false },
      ],
      volumes: [
        { name: "ckpt", path: "/data", read_only: false },
        { name: "refs", path: "./refs", read_only: true },
      ],
    });

    const data = screen.getByText("Data").closest(".fact") as HTMLElement;
    const items = within(data).getAllByRole("listitem").map((li) => li.textContent);
    expect(items).toEqual([
      "s3://acme-data/imagenet/ → imagenet · 200 files, 1.8 GB, versioned",
      "https://example.com/vocab.txt → vocab.txt · 1 file, 2.0 KB, writable",
    ]);
    const volumes = screen.getByText("Volumes").closest(".fact") as HTMLElement;
    expect(within(volumes).getAllByRole("listitem").map((li) => li.textContent)).toEqual(["ckpt at /data", "refs at ./refs (read-only)"]);
  });

  it("says when an input's listing is not known", () => {
    facts({ data_inputs: [{ ...IMAGENET, file_count: null, total_size: null, versioned: false }] });

    expect(screen.getByRole("listitem")).toHaveTextContent("s3://acme-data/imagenet/ → imagenet · listing not known");
    expect(screen.queryByText("Volumes")).toBeNull();
  });

  it("shows no row for a job without data or volumes, or from the runs list (which has neither field)", () => {
    const { container, rerender } = facts({ data_inputs: [], volumes: [] });
    expect(container.querySelector("dl")).toBeEmptyDOMElement();

    rerender(
      <dl>
        <JobDataFacts job={{}} />
      </dl>,
    );
    expect(container.querySelector("dl")).toBeEmptyDOMElement();
  });
});
