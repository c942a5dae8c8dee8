import { act, render, renderHook, screen } from "@testing-library/react";
import { describe, expect, it } from "vitest";
import { ACTIONS_COLUMN, DataTable } from "../components/DataTable";
import { useApiList } from "../lib/hooks";

const columns = ["Name", { label: "Size", className: "num" }, false, ACTIONS_COLUMN];
const row = (name: string) => (
  <tr key={name}>
    <td>{name}</td>
    <td className="num">1</td>
    <td className="actions" />
  </tr>
);

describe("DataTable", () => {
  it("shows a spinner until the rows arrive, and nothing but the page's error if loading failed", () => {
    const { rerender } = render(<DataTable rows={undefined} columns={columns} renderRow={row} />);
    expect(screen.getByRole("status")).toHaveTextContent("Loading…");
    rerender(<DataTable rows={undefined} error="boom" columns={columns} renderRow={row} />);
    expect(screen.queryByRole("status")).toBeNull();
    expect(screen.queryByRole("table")).toBeNull();
  });

  it("shows the empty state for no rows, or an empty table when there is none", () => {
    const { rerender } = render(<DataTable rows={[]} empty={<p>Nothing here</p>} columns={columns} renderRow={row} />);
    expect(screen.getByText("Nothing here")).toBeInTheDocument();
    expect(screen.queryByRole("table")).toBeNull();
    rerender(<DataTable rows={[]} columns={columns} renderRow={row} />);
    expect(screen.getByRole("table")).toBeInTheDocument();
  });

  it("renders the headers (skipping hidden columns) and the rows", () => {
    const { container } = render(<DataTable rows={["a", "b"]} columns={columns} renderRow={row} />);
    const headers = screen.getAllByRole("columnheader");
    expect(headers.map((th) => th.textContent)).toEqual(["Name", "Size", "Actions"]);
    expect(headers.every((th) => th.getAttribute("scope") === "col")).toBe(true);
    expect(headers[1]).toHaveClass("num");
    expect(headers[2].querySelector(".visually-hidden")).not.toBeNull();
    expect(container.querySelector(".table-wrap > table.table")).not.toBeNull();
    expect(screen.getAllByRole("row")).toHaveLength(3);
  });
});

describe("useApiList", () => {
  it("reloads after an action and keeps a failed action's error apart from the load error", async () => {
    let items = ["a"];
    const { result } = renderHook(() => useApiList<string>("k", async () => items));
    await act(async () => {});
    expect(result.current.data).toEqual(["a"]);

    await act(() => result.current.act(async () => {
      items = ["a", "b"];
    }));
    expect(result.current.data).toEqual(["a", "b"]);
    expect(result.current.actionError).toBeNull();

    await act(() => result.current.act(() => Promise.reject(new Error("nope"))));
    expect(result.current.actionError).toBe("nope");
    expect(result.current.error).toBeNull();
    expect(result.current.data).toEqual(["a", "b"]);
  });
});
