import { act, fireEvent, render, screen, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { LogViewer, type ViewerLine } from "../components/LogViewer";

const ROW = 18;
const VIEWPORT = 180; // ten rows

function makeLines(count: number, text = (i: number) => `line ${i}`): ViewerLine[] {
  return Array.from({ length: count }, (_, i) => ({ seq: i + 1, ts: 0, stream: i % 10 === 9 ? "e" : "o", text: text(i + 1) }));
}

const attempts = [{ attempt: 1, lineIndex: 0, label: "── Attempt 1 ──" }];

// jsdom does no layout: give every element a 180px-high viewport.
let restore: PropertyDescriptor | undefined;
beforeAll(() => {
  restore = Object.getOwnPropertyDescriptor(HTMLElement.prototype, "clientHeight");
  Object.defineProperty(HTMLElement.prototype, "clientHeight", { configurable: true, get: () => VIEWPORT });
});
afterAll(() => {
  if (restore) Object.defineProperty(HTMLElement.prototype, "clientHeight", restore);
});

describe("LogViewer", () => {
  it("renders ANSI colours as styled spans and marks stderr lines", () => {
    const lines: ViewerLine[] = [
      { seq: 1, ts: 0, stream: "o", text: "\u001b[31mred\u001b[0m then \u001b[1;32mbold green\u001b[0m plain" },
      { seq: 2, ts: 0, stream: "e", text: "Traceback (most recent call last):" },
    ];
    render(<LogViewer lines={lines} label="Logs of train" />);
    const log = screen.getByRole("log", { name: "Logs of train" });

    const red = within(log).getByText("red");
    expect(red.closest("span.ansi")).toHaveStyle({ color: "rgb(255, 123, 114)" });
    const green = within(log).getByText("bold green").closest("span.ansi") as HTMLElement;
    expect(green).toHaveStyle({ color: "rgb(63, 185, 80)", fontWeight: "600" });
    expect(within(log).getByText(/plain/).closest("span.ansi")).toBeNull();
    expect(log.textContent).not.toContain("\u001b");

    const stderrRow = log.querySelector('[data-seq="2"]') as HTMLElement;
    expect(stderrRow).toHaveClass("stderr");
    expect(within(stderrRow).getByLabelText("stderr")).toBeInTheDocument();
    expect(log.querySelector('[data-seq="1"]')).not.toHaveClass("stderr");
  });

  it("follows new lines to the bottom, stops when the user scrolls up, and resumes with Follow", async () => {
    const { rerender } = render(<LogViewer lines={makeLines(100)} attempts={attempts} label="Logs" />);
    const log = screen.getByRole("log");
    const bottom = (lines: number) => (lines + 1) * ROW - VIEWPORT; // +1: the attempt header row

    expect(log.scrollTop).toBe(bottom(100));
    rerender(<LogViewer lines={makeLines(150)} attempts={attempts} label="Logs" />);
    expect(log.scrollTop).toBe(bottom(150));
    expect(screen.getByRole("button", { name: "Follow" })).toHaveAttribute("aria-pressed", "true");

    // The user scrolls up: following stops and new lines leave the view alone.
    log.scrollTop = 500;
    fireEvent.scroll(log);
    expect(screen.getByRole("button", { name: "Follow" })).toHaveAttribute("aria-pressed", "false");
    rerender(<LogViewer lines={makeLines(300)} attempts={attempts} label="Logs" />);
    expect(log.scrollTop).toBe(500);
    expect(within(log).getByText("line 28")).toBeInTheDocument(); // row 28 sits at 504px

    await userEvent.click(screen.getByRole("button", { name: "Follow" }));
    expect(log.scrollTop).toBe(bottom(300));
    expect(within(log).getByText("line 300")).toBeInTheDocument();
  });

  it("stops following on an upward wheel gesture before the scroll event", () => {
    render(<LogViewer lines={makeLines(100)} label="Logs" />);
    fireEvent.wheel(screen.getByRole("log"), { deltaY: -40 });
    expect(screen.getByRole("button", { name: "Follow" })).toHaveAttribute("aria-pressed", "false");
  });

  it("renders only a window of rows for a 200,000-line log", () => {
    const lines = makeLines(200_000);
    render(<LogViewer lines={lines} label="Logs" />);
    const log = screen.getByRole("log");
    const rows = log.querySelectorAll("[data-seq]");
    expect(rows.length).toBeLessThan(100);
    expect(within(log).getByText("line 200000")).toBeInTheDocument();
    expect((log.firstElementChild as HTMLElement).style.height).toBe(`${200_000 * ROW}px`);
  });

  it("finds and highlights matches, and steps through them with next and previous", async () => {
    const user = userEvent.setup();
    const lines = makeLines(1000, (i) => (i === 10 || i === 500 || i === 900 ? `epoch ${i} \u001b[33mloss=NaN\u001b[0m` : `step ${i} ok`));
    render(<LogViewer lines={lines} label="Logs" />);
    const log = screen.getByRole("log");

    await user.type(screen.getByRole("searchbox", { name: "Search logs" }), "nan");
    expect(screen.getByText("1 / 3")).toBeInTheDocument();
    // The view jumped to the first match, which is highlighted as the current one.
    let current = log.querySelector("mark.current") as HTMLElement;
    expect(current).toHaveTextContent("NaN");
    expect(current.closest("[data-seq]")).toHaveAttribute("data-seq", "10");
    expect(screen.getByRole("log")).toHaveAttribute("data-follow", "off");

    await user.click(screen.getByRole("button", { name: "Next match" }));
    expect(screen.getByText("2 / 3")).toBeInTheDocument();
    current = log.querySelector("mark.current") as HTMLElement;
    expect(current.closest("[data-seq]")).toHaveAttribute("data-seq", "500");

    await user.keyboard("{Enter}");
    expect(screen.getByText("3 / 3")).toBeInTheDocument();
    await user.click(screen.getByRole("button", { name: "Previous match" }));
    expect(screen.getByText("2 / 3")).toBeInTheDocument();

    await user.clear(screen.getByRole("searchbox", { name: "Search logs" }));
    await user.type(screen.getByRole("searchbox", { name: "Search logs" }), "no such text");
    expect(screen.getByText("No matches")).toBeInTheDocument();
    expect(log.querySelector("mark")).toBeNull();
  });

  it("jumps to an attempt's header", async () => {
    render(<LogViewer lines={makeLines(500)} attempts={attempts} label="Logs" />);
    const log = screen.getByRole("log");
    expect(log.scrollTop).toBeGreaterThan(0);
    await userEvent.click(screen.getByRole("button", { name: "Jump to attempt 1" }));
    expect(log.scrollTop).toBe(0);
    expect(within(log).getByText("── Attempt 1 ──")).toBeInTheDocument();
  });
});

describe("LogViewer with lines appended in place", () => {
  it("shows lines pushed into the same array when the version changes", () => {
    const lines = makeLines(3);
    const { rerender } = render(<LogViewer lines={lines} version={1} label="Logs" />);
    act(() => {
      lines.push({ seq: 4, ts: 0, stream: "o", text: "fresh line" });
    });
    rerender(<LogViewer lines={lines} version={2} label="Logs" />);
    expect(screen.getByText("fresh line")).toBeInTheDocument();
  });
});
