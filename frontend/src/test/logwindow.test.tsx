import { act, fireEvent, render, screen, waitFor, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { afterAll, beforeAll, describe, expect, it, vi } from "vitest";
import { LogViewer } from "../components/LogViewer";
import { CHUNK_LINES, LogWindowStore, OPEN_LINES, WINDOW_LINES, lineWithSeq, type LogSource, type WindowPage } from "../lib/logwindow";
import type { Stream } from "../api/types";

const ROW = 18;
const VIEWPORT = 180; // ten rows

/** A server holding a finished log of `count` lines, "line <seq>", as the pages endpoint answers. */
function fakeSource(count: number): LogSource & { calls: Record<string, number>[] } {
  const calls: Record<string, number>[] = [];
  const lines = (from: number, to: number): WindowPage["lines"] =>
    Array.from({ length: Math.max(0, to - from + 1) }, (_, i) => ({ seq: from + i, ts: 0, stream: "o" as Stream, text: `line ${from + i}` }));
  return {
    calls,
    page: async (_job, query) => {
      calls.push(query as Record<string, number>);
      const limit = query.tail ?? query.limit ?? 1000;
      if (query.tail !== undefined || query.before_seq !== undefined) {
        const end = query.before_seq !== undefined ? Math.min(count, query.before_seq - 1) : count;
        const start = Math.max(1, end - limit + 1);
        return { lines: lines(start, end), has_more: start > 1, last_seq: count };
      }
      const start = (query.after_seq ?? 0) + 1;
      const end = Math.min(count, start + limit - 1);
      return { lines: lines(start, end), has_more: end < count, last_seq: count };
    },
    search: async (_job, text, fromSeq, direction) => {
      const wanted = Number(text.replace("line ", ""));
      if (!(wanted >= 1 && wanted <= count)) return null;
      return (direction === "next" ? wanted >= fromSeq : wanted <= fromSeq) ? wanted : null;
    },
  };
}

const settle = () => act(async () => {
  await new Promise((resolve) => setTimeout(resolve, 0));
});

let restore: PropertyDescriptor | undefined;
beforeAll(() => {
  restore = Object.getOwnPropertyDescriptor(HTMLElement.prototype, "clientHeight");
  Object.defineProperty(HTMLElement.prototype, "clientHeight", { configurable: true, get: () => VIEWPORT });
});
afterAll(() => {
  if (restore) Object.defineProperty(HTMLElement.prototype, "clientHeight", restore);
});

describe("LogWindowStore", () => {
  it("opens at the tail and sizes the log by its last stored line", async () => {
    const source = fakeSource(2_000_000);
    const store = new LogWindowStore(source);
    store.observe("j", 2_000_000);
    expect(store.window("j").total).toBe(2_000_000);

    store.need("j", 0, 0);
    await settle();

    const w = store.window("j");
    expect(source.calls).toEqual([{ tail: OPEN_LINES }]);
    expect([w.fromSeq, w.toSeq, w.total, w.lines.length]).toEqual([2_000_000 - OPEN_LINES + 1, 2_000_000, 2_000_000, OPEN_LINES]);
  });

  it("reads before and after what it holds, jumps far, and never holds more than its bound", async () => {
    const source = fakeSource(200_000);
    const store = new LogWindowStore(source);
    store.need("j", 0, 0);
    await settle();

    for (let i = 0; i < 6; i += 1) {
      const w = store.window("j");
      store.need("j", w.fromSeq - 40, w.fromSeq + 10);
      await settle();
    }
    let w = store.window("j");
    expect(source.calls.slice(1, 3)).toEqual([{ before_seq: 199_001, limit: CHUNK_LINES }, { before_seq: 194_001, limit: CHUNK_LINES }]);
    expect(w.lines.length).toBe(WINDOW_LINES);
    expect([w.fromSeq, w.toSeq]).toEqual([169_001, 189_000]);
    expect(w.lines[0].seq).toBe(169_001);

    store.need("j", 1, 60);
    await settle();
    w = store.window("j");
    expect(source.calls.at(-1)).toEqual({ after_seq: 0, limit: CHUNK_LINES });
    expect([w.fromSeq, w.toSeq, w.lines.length]).toEqual([1, CHUNK_LINES, CHUNK_LINES]);
    expect(lineWithSeq(w.lines, 1)?.text).toBe("line 1");

    store.need("j", CHUNK_LINES - 20, CHUNK_LINES + 30);
    await settle();
    expect(source.calls.at(-1)).toEqual({ after_seq: CHUNK_LINES, limit: CHUNK_LINES });
    expect(store.window("j").toSeq).toBe(2 * CHUNK_LINES);
  });

  it("keeps live lines that continue the window and trims its head; others only lengthen the log", async () => {
    const store = new LogWindowStore(fakeSource(WINDOW_LINES));
    store.need("j", 0, 0);
    await settle();
    // The opening tail holds OPEN_LINES; fill up to the bound, then past it.
    const frame = (from: number, count: number): [number, number, Stream, string][] =>
      Array.from({ length: count }, (_, i) => [from + i, 0, "o", `live ${from + i}`]);
    store.append("j", frame(WINDOW_LINES - 2, 10)); // overlaps the tail: the repeated lines are dropped
    let w = store.window("j");
    expect([w.toSeq, w.total, w.lines.length]).toEqual([WINDOW_LINES + 7, WINDOW_LINES + 7, OPEN_LINES + 7]);
    store.append("j", frame(WINDOW_LINES + 8, WINDOW_LINES));
    w = store.window("j");
    expect(w.lines.length).toBe(WINDOW_LINES);
    expect(w.lines[w.lines.length - 1].text).toBe(`live ${2 * WINDOW_LINES + 7}`);

    // The user read the start: new lines do not join a window that does not reach the end.
    store.need("j", 1, 40);
    await settle();
    const held = store.window("j").lines.length;
    store.append("j", frame(2 * WINDOW_LINES + 8, 5));
    w = store.window("j");
    expect([w.lines.length, w.total]).toEqual([held, 2 * WINDOW_LINES + 12]);
    expect(store.resumeSeq("j")).toBe(2 * WINDOW_LINES + 12);
  });
});

describe("LogViewer over a window", () => {
  function Viewer({ store }: { store: LogWindowStore }) {
    const w = store.window("j");
    return (
      <LogViewer
        lines={w.lines}
        version={store.version}
        label="Logs"
        windowed={{ total: w.total, onNeed: (a, b) => store.need("j", a, b), search: (t, f, d) => store.search("j", t, f, d) }}
      />
    );
  }

  it("shows a 2,000,000-line log's last line at the bottom and reads the top when scrolled there", async () => {
    const store = new LogWindowStore(fakeSource(2_000_000));
    store.need("j", 0, 0);
    await settle();
    const { rerender } = render(<Viewer store={store} />);
    const log = screen.getByRole("log");

    expect(within(log).getByText("line 2000000")).toBeInTheDocument();
    expect(log).toHaveAttribute("data-total", "2000000");
    expect(Number(log.getAttribute("data-held"))).toBe(OPEN_LINES);
    // The canvas stays under browsers' height limits; the scrollbar is scaled.
    const canvas = log.querySelector(".log-canvas") as HTMLElement;
    expect(parseInt(canvas.style.height, 10)).toBeLessThan(2_000_000 * ROW);

    log.scrollTop = 0;
    fireEvent.scroll(log);
    await settle();
    rerender(<Viewer store={store} />);
    expect(log.querySelector("[data-pending]")).toBeNull();
    expect(within(log).getByText("line 1")).toBeInTheDocument();
    expect(Number(log.getAttribute("data-held"))).toBe(CHUNK_LINES);
  });

  it("asks the server for the next match and jumps to a line it did not hold", async () => {
    const user = userEvent.setup();
    const store = new LogWindowStore(fakeSource(200_000));
    const search = vi.spyOn(store, "search");
    store.need("j", 0, 0);
    await settle();
    const { rerender } = render(<Viewer store={store} />);
    const log = screen.getByRole("log");

    await user.type(screen.getByRole("searchbox", { name: "Search logs" }), "line 1234");
    await waitFor(() => expect(screen.getByText("line 1,234")).toBeInTheDocument());
    expect(search).toHaveBeenCalledWith("j", "line 1234", 1, "next");
    await settle();
    rerender(<Viewer store={store} />);
    const row = log.querySelector('[data-seq="1234"]') as HTMLElement;
    expect(row.querySelector("mark.current")).toHaveTextContent("line 1234");

    await user.click(screen.getByRole("button", { name: "Next match" }));
    await waitFor(() => expect(search).toHaveBeenLastCalledWith("j", "line 1234", 1, "next")); // none after it: wraps
    await user.clear(screen.getByRole("searchbox", { name: "Search logs" }));
    await user.type(screen.getByRole("searchbox", { name: "Search logs" }), "no such text");
    await waitFor(() => expect(screen.getByText("No matches")).toBeInTheDocument());
  });

  it("follows a live job to its newest line and trims the head past the bound", async () => {
    const store = new LogWindowStore(fakeSource(100));
    store.need("j", 0, 0);
    await settle();
    const { rerender } = render(<Viewer store={store} />);
    const log = screen.getByRole("log");
    expect(within(log).getByText("line 100")).toBeInTheDocument();

    for (let from = 101; from <= 25_100; from += 5_000) {
      act(() => store.append("j", Array.from({ length: 5_000 }, (_, i) => [from + i, 0, "o" as Stream, `live ${from + i}`])));
      rerender(<Viewer store={store} />);
    }

    expect(log).toHaveAttribute("data-follow", "on");
    expect(within(log).getByText("live 25100")).toBeInTheDocument();
    expect(log).toHaveAttribute("data-held", String(WINDOW_LINES));
    expect(log).toHaveAttribute("data-total", "25100");
  });

  it("shows placeholder rows for lines it does not hold and asks for them", () => {
    const onNeed = vi.fn();
    render(<LogViewer lines={[]} label="Logs" windowed={{ total: 1000, onNeed, search: async () => null }} />);
    const log = screen.getByRole("log");
    expect(log.querySelectorAll("[data-pending]").length).toBeGreaterThan(10);
    expect(onNeed).toHaveBeenCalledWith(expect.any(Number), 1000);
  });
});
