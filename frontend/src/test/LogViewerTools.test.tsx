import { fireEvent, render, screen } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { afterAll, afterEach, beforeAll, describe, expect, it } from "vitest";
import { LogViewer, lineStamp, linkedSeq, wrappedRows, type ViewerLine } from "../components/LogViewer";

const ROW = 18;
const VIEWPORT = 180; // ten rows

function makeLines(count: number): ViewerLine[] {
  // 2026-12-02T12:00:00.000Z plus a quarter second a line.
  return Array.from({ length: count }, (_, i) => ({ seq: i + 1, ts: 1_796_212_800 + i / 4, stream: "o", text: `line ${i + 1}` }));
}

let restore: PropertyDescriptor | undefined;
beforeAll(() => {
  restore = Object.getOwnPropertyDescriptor(HTMLElement.prototype, "clientHeight");
  Object.defineProperty(HTMLElement.prototype, "clientHeight", { configurable: true, get: () => VIEWPORT });
});
afterAll(() => {
  if (restore) Object.defineProperty(HTMLElement.prototype, "clientHeight", restore);
});
afterEach(() => {
  window.history.replaceState(null, "", "/");
  window.localStorage.clear();
});

describe("the log viewer's tools", () => {
  it("reads a permalink's seq and counts a wrapped line's rows", () => {
    expect(linkedSeq("#L42")).toBe(42);
    expect(linkedSeq("#L0")).toBeNull();
    expect(linkedSeq("#Lx")).toBeNull();
    expect(linkedSeq("")).toBeNull();
    expect(wrappedRows("", 80)).toBe(1);
    expect(wrappedRows("x".repeat(80), 80)).toBe(1);
    expect(wrappedRows("x".repeat(81), 80)).toBe(2);
    expect(wrappedRows("\tx", 8)).toBe(2); // the tab fills the first row
    expect(wrappedRows("x".repeat(500), 0)).toBe(1); // not measured yet: one row
    expect(lineStamp(1_796_212_800.25)).toBe("2026-12-02T12:00:00.250Z");
  });

  it("shows each line's time when Timestamps is pressed, and remembers it", async () => {
    const user = userEvent.setup();
    const { unmount } = render(<LogViewer lines={makeLines(3)} label="Logs" />);
    const log = screen.getByRole("log");
    expect(log.querySelectorAll(".log-ts")).toHaveLength(0);
    await user.click(screen.getByRole("button", { name: "Timestamps" }));
    expect(screen.getByRole("button", { name: "Timestamps" })).toHaveAttribute("aria-pressed", "true");
    expect(log.querySelector('[data-seq="3"] .log-ts')?.textContent).toBe("2026-12-02T12:00:00.500Z");
    unmount();
    render(<LogViewer lines={makeLines(3)} label="Logs" />);
    expect(screen.getByRole("log")).toHaveAttribute("data-timestamps", "on");
  });

  it("opens at the line the address links to, highlighted, and a click on a number links to it", async () => {
    window.history.replaceState(null, "", "/w/acme/runs/r?job=train#L50");
    render(<LogViewer lines={makeLines(200)} label="Logs" linkParams={{ job: "train" }} />);
    const log = screen.getByRole("log");
    expect(log).toHaveAttribute("data-follow", "off");
    expect(log.scrollTop).toBe(49 * ROW - VIEWPORT / 3);
    expect(log.querySelector('[data-seq="50"]')).toHaveClass("log-linked");

    fireEvent.click(screen.getByRole("link", { name: "Line 52" }));
    expect(window.location.pathname + window.location.search + window.location.hash).toBe("/w/acme/runs/r?job=train#L52");
    expect(log.querySelector('[data-seq="52"]')).toHaveClass("log-linked");
    expect(log.querySelector('[data-seq="50"]')).not.toHaveClass("log-linked");
  });

  it("waits for a linked line the log does not reach yet", () => {
    window.history.replaceState(null, "", "/#L150");
    const { rerender } = render(<LogViewer lines={makeLines(100)} version={1} label="Logs" />);
    const log = screen.getByRole("log");
    expect(log.scrollTop).toBe(0);
    rerender(<LogViewer lines={makeLines(200)} version={2} label="Logs" />);
    expect(log.scrollTop).toBe(149 * ROW - VIEWPORT / 3);
    expect(log.querySelector('[data-seq="150"]')).toHaveClass("log-linked");
  });
});
