import { render, screen, within } from "@testing-library/react";
import userEvent from "@testing-library/user-event";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import type { Attempt } from "../api/types";
import { AttemptsTable } from "../components/AttemptsTable";
import { LogViewer, type ViewerLine } from "../components/LogViewer";
import { attemptMarks, clockTime, startLabel } from "../lib/attempts";
import { money } from "../lib/format";

const ROW = 18;

// Local times, so that the labels read the same in any time zone.
const at = (h: number, m: number, s: number) => new Date(2026, 0, 5, h, m, s).toISOString();

function attempt(overrides: Partial<Attempt> & Pick<Attempt, "number">): Attempt {
  return {
    status: "ended",
    instance: `local-${overrides.number}a2b3c4d`,
    reason: "done",
    message: "",
    exit_code: null,
    started_at: at(10, overrides.number, 0),
    finished_at: at(10, overrides.number, 30),
    first_seq: 1,
    last_seq: null,
    offers_tried: [],
    environment: "",
    cost: null,
    price_per_hour: null,
    billed_seconds: null,
    created_at: at(10, 0, 0),
    ...overrides,
  };
}

function lines(from: number, to: number): ViewerLine[] {
  return Array.from({ length: to - from + 1 }, (_, i) => ({ seq: from + i, ts: 0, stream: "o", text: `line ${from + i}` }));
}

/** The log's rows top to bottom: marks as their label, lines as their text. */
function rowTexts(): string[] {
  const log = screen.getByRole("log");
  return Array.from(log.querySelectorAll(".log-row")).map((row) => row.querySelector(".log-text")?.textContent ?? "");
}

const lost = attempt({
  number: 1,
  instance: "local-1a2b3c4d",
  started_at: at(10, 1, 5),
  reason: "instance_lost",
  message: "machine local-1a2b3c4d is gone (process 4242 not found)",
  first_seq: 1,
  last_seq: 3,
});

let restore: PropertyDescriptor | undefined;
beforeAll(() => {
  restore = Object.getOwnPropertyDescriptor(HTMLElement.prototype, "clientHeight");
  Object.defineProperty(HTMLElement.prototype, "clientHeight", { configurable: true, get: () => 180 });
});
afterAll(() => {
  if (restore) Object.defineProperty(HTMLElement.prototype, "clientHeight", restore);
});

describe("attempt marks from a job's attempts", () => {
  it("heads each attempt's lines and says how a lost attempt ended", () => {
    const second = attempt({ number: 2, instance: "local-5e6f7a8b", started_at: at(10, 4, 11), status: "running", reason: "", finished_at: null, first_seq: 4 });
    const log = lines(1, 5);
    render(<LogViewer lines={log} attempts={attemptMarks({ attempts: [second, lost] }, log)} label="Logs" />);

    expect(rowTexts()).toEqual([
      "Attempt 1 on local-1a2b3c4d — started 10:01:05",
      "line 1",
      "line 2",
      "line 3",
      "Attempt 1 ended: instance lost — machine local-1a2b3c4d is gone (process 4242 not found)",
      "Attempt 2 on local-5e6f7a8b — started 10:04:11",
      "line 4",
      "line 5",
    ]);
    expect(screen.getByRole("log").querySelector('[data-mark="end"]')).toHaveAttribute("data-attempt", "1");
  });

  it("gives an attempt without lines its marks where its lines would be, and jumps to it", async () => {
    const expired = attempt({ number: 2, instance: "local-2a2b3c4d", status: "ended", reason: "lease_expired", started_at: null, first_seq: 201, last_seq: 200 });
    const third = attempt({ number: 3, instance: "local-3a2b3c4d", started_at: at(10, 9, 0), reason: "error", exit_code: 1, first_seq: 201, last_seq: 400 });
    const first = { ...lost, last_seq: 200 };
    const log = lines(1, 400);
    const marks = attemptMarks({ attempts: [first, expired, third] }, log);
    expect(marks.map((m) => [m.attempt, m.kind, m.lineIndex])).toEqual([
      [1, "start", 0],
      [1, "end", 200],
      [2, "start", 200],
      [2, "end", 200],
      [3, "start", 200],
      [3, "end", 400],
    ]);
    expect(marks.map((m) => m.label).slice(2)).toEqual([
      "Attempt 2 on local-2a2b3c4d — never started",
      "Attempt 2 ended: lease expired",
      "Attempt 3 on local-3a2b3c4d — started 10:09:00",
      "Attempt 3 ended: failed (exit code 1)",
    ]);

    // The viewer orders marks itself: at one line by attempt, a start before its end.
    render(<LogViewer lines={log} attempts={[...marks].reverse()} label="Logs" />);
    const view = screen.getByRole("log");
    await userEvent.click(screen.getByRole("button", { name: "Jump to attempt 2" }));
    // Rows: attempt 1's mark, its 200 lines, its end mark, then attempt 2's mark.
    expect(view.scrollTop).toBe(202 * ROW);
    expect(rowTexts().slice(rowTexts().indexOf("line 200"), rowTexts().indexOf("line 201") + 1)).toEqual([
      "line 200",
      "Attempt 1 ended: instance lost — machine local-1a2b3c4d is gone (process 4242 not found)",
      "Attempt 2 on local-2a2b3c4d — never started",
      "Attempt 2 ended: lease expired",
      "Attempt 3 on local-3a2b3c4d — started 10:09:00",
      "line 201",
    ]);
    expect(screen.getAllByRole("button", { name: /^Jump to attempt/ }).map((b) => b.textContent)).toEqual([
      "Jump to attempt 1",
      "Jump to attempt 2",
      "Jump to attempt 3",
    ]);
  });

  it("puts marks of attempts that have no lines yet after the last line", () => {
    const waiting = attempt({ number: 2, status: "assigned", reason: "", started_at: null, finished_at: null, first_seq: 4 });
    const log = lines(1, 3);
    render(<LogViewer lines={log} attempts={attemptMarks({ attempts: [lost, waiting] }, log)} label="Logs" />);
    expect(rowTexts().slice(-2)).toEqual([
      "Attempt 1 ended: instance lost — machine local-1a2b3c4d is gone (process 4242 not found)",
      "Attempt 2 on local-2a2b3c4d — waiting to start",
    ]);
  });

  it("shows no marks for a job whose only attempt ended normally or is still running", () => {
    const log = lines(1, 3);
    for (const only of [
      attempt({ number: 1, reason: "done", last_seq: 3 }),
      attempt({ number: 1, reason: "error", exit_code: 2, last_seq: 3 }),
      attempt({ number: 1, reason: "stopped_by_user", last_seq: 3 }),
      attempt({ number: 1, status: "running", reason: "", finished_at: null }),
    ]) {
      expect(attemptMarks({ attempts: [only] }, log)).toEqual([]);
    }
    expect(attemptMarks({ attempts: [] }, log)).toEqual([]);

    render(<LogViewer lines={log} attempts={attemptMarks({ attempts: [attempt({ number: 1, last_seq: 3 })] }, log)} label="Logs" />);
    expect(rowTexts()).toEqual(["line 1", "line 2", "line 3"]);
    expect(screen.queryByRole("button", { name: /Jump to attempt/ })).toBeNull();
  });

  it("marks a single attempt that ended abnormally, and a last attempt that ended done gets no end mark", () => {
    const log = lines(1, 3);
    expect(attemptMarks({ attempts: [lost] }, log).map((m) => m.kind)).toEqual(["start", "end"]);
    const done = attempt({ number: 2, first_seq: 4, last_seq: 5 });
    expect(attemptMarks({ attempts: [lost, done] }, lines(1, 5)).map((m) => [m.attempt, m.kind])).toEqual([
      [1, "start"],
      [1, "end"],
      [2, "start"],
    ]);
  });
});

describe("AttemptsTable", () => {
  const noCapacity = attempt({
    number: 1,
    instance: null,
    started_at: null,
    reason: "no_capacity",
    message: "no capacity: tried 1 of 2 offers",
    last_seq: 0,
    offers_tried: [{ offer: "fake/acct/fake-small/on-demand", instance: "fake-0001", outcome: "no_capacity", message: "no fake-small left in eu-1" }],
  });
  const running = attempt({
    number: 2,
    instance: "fake-0002",
    started_at: at(10, 4, 11),
    status: "running",
    reason: "",
    finished_at: null,
    offers_tried: [{ offer: "fake/acct/fake-large/on-demand", instance: "fake-0002", outcome: "launched", message: "" }],
  });

  it("lists each attempt with its instance, times, reason, message and the offers tried", () => {
    render(<AttemptsTable attempts={[running, noCapacity]} now={new Date(at(10, 5, 11)).getTime()} />);
    const table = within(screen.getByRole("region", { name: "Attempts" })).getByRole("table");
    const rows = within(table).getAllByRole("row").slice(1);
    expect(within(table).getAllByRole("columnheader").map((h) => h.textContent)).toEqual([
      "#",
      "Instance",
      "Started",
      "Ended",
      "Duration",
      "Cost",
      "Outcome",
      "Offers tried",
    ]);
    const cells = (row: HTMLElement) => within(row).getAllByRole("cell").map((c) => c.textContent);
    expect(cells(rows[0])).toEqual([
      "1",
      "—",
      "—",
      "10:01:30",
      "—",
      "—",
      "no capacityno capacity: tried 1 of 2 offers",
      "tried fake/acct/fake-small/on-demand: no capacity — no fake-small left in eu-1",
    ]);
    expect(within(rows[0]).getByText("no capacity")).toHaveAttribute("title", "no offer had capacity");
    expect(cells(rows[1])).toEqual(["2", "fake-0002", "10:04:11", "—", "1m 0s", "—", "running", "launched fake/acct/fake-large/on-demand"]);
  });

  it("shows a spot job's switch to on-demand and each failed offer's error code", () => {
    const switched = attempt({
      number: 1,
      instance: "fake-0003",
      started_at: at(10, 4, 11),
      status: "running",
      reason: "",
      finished_at: null,
      offers_tried: [
        { offer: "", instance: "", outcome: "switched_to_on_demand", message: "switched to on-demand: every spot offer (1) was tried or is blocked" },
        { offer: "fake/r1/r1a/a/spot", instance: "fake-0002", outcome: "no_capacity", code: "FakeNoCapacity", message: "" },
        { offer: "fake/r1/r1a/a/on-demand", instance: "fake-0003", outcome: "launched", message: "" },
      ],
    });
    render(<AttemptsTable attempts={[switched]} now={new Date(at(10, 5, 11)).getTime()} />);
    const items = within(screen.getByRole("table")).getAllByRole("listitem").map((li) => li.textContent);
    expect(items).toEqual([
      "spot → on-demand — switched to on-demand: every spot offer (1) was tried or is blocked",
      "tried fake/r1/r1a/a/spot: no capacity (FakeNoCapacity)",
      "launched fake/r1/r1a/a/on-demand",
    ]);
  });

  it("says how an attempt ended in words, with its exit code, and has no offers column when none were tried", () => {
    const lostOne = { ...lost, finished_at: at(10, 2, 5) };
    const failed = attempt({ number: 2, started_at: at(10, 3, 0), finished_at: at(10, 3, 42), reason: "error", exit_code: 3, message: "" });
    render(<AttemptsTable attempts={[lostOne, failed]} now={0} />);
    const table = screen.getByRole("table");
    expect(within(table).queryByRole("columnheader", { name: "Offers tried" })).toBeNull();
    const rows = within(table).getAllByRole("row").slice(1);
    expect(within(rows[0]).getByText("instance lost")).toHaveClass("reason-instance_lost");
    expect(within(rows[0]).getByText("machine local-1a2b3c4d is gone (process 4242 not found)")).toBeInTheDocument();
    expect(within(rows[0]).getAllByRole("cell")[4]).toHaveTextContent("1m 0s");
    expect(within(rows[1]).getAllByRole("cell")[6]).toHaveTextContent("failed · exit code 3");
  });

  it("names the guards' endings: idle GPUs and a stalled job, with the server's message", () => {
    const idle = attempt({ number: 1, finished_at: at(10, 2, 5), reason: "low_gpu_utilization", message: "every GPU stayed below 10% for 30m (peak 2%)" });
    const stalled = attempt({ number: 2, finished_at: at(10, 3, 5), reason: "stalled", message: "no output for 20m (stall)" });
    render(<AttemptsTable attempts={[idle, stalled]} now={0} />);
    const rows = within(screen.getByRole("table")).getAllByRole("row").slice(1);
    expect(within(rows[0]).getByText("GPUs idle")).toHaveClass("reason-low_gpu_utilization");
    expect(within(rows[0]).getByText("GPUs idle")).toHaveAttribute("title", expect.stringContaining("utilization_policy"));
    expect(within(rows[0]).getByText("every GPU stayed below 10% for 30m (peak 2%)")).toBeInTheDocument();
    expect(within(rows[1]).getByText("stalled")).toHaveClass("reason-stalled");
    expect(within(rows[1]).getByText("stalled")).toHaveAttribute("title", expect.stringContaining("stall timeout"));
  });

  it("says which checkpoint a resumed attempt started from", () => {
    const resumed = attempt({ number: 2, instance: "local-5e6f7a8b", restored_checkpoint: 4 });
    render(<AttemptsTable attempts={[lost, resumed]} now={0} />);
    const rows = within(screen.getByRole("table")).getAllByRole("row").slice(1);
    expect(within(rows[0]).getAllByRole("cell")[1]).toHaveTextContent(/^local-1a2b3c4d$/);
    expect(within(rows[1]).getAllByRole("cell")[1]).toHaveTextContent("local-5e6f7a8bresumed from checkpoint 4");
  });

  it("names the environment an attempt ran in, with its lock to download", () => {
    const built = attempt({ number: 1, environment: "a1380c1f0a9e6a3ef7ab65bf" });
    render(<AttemptsTable attempts={[built]} now={0} lockUrl={(key) => `/api/v1/workspaces/acme/environments/${key}/lock`} />);
    const cell = within(within(screen.getByRole("table")).getAllByRole("row")[1]).getAllByRole("cell")[1];
    expect(cell).toHaveTextContent("environment a1380c1f0a9e6a3ef7ab65bf · lock");
    expect(within(cell).getByRole("link", { name: "lock" })).toHaveAttribute(
      "href",
      "/api/v1/workspaces/acme/environments/a1380c1f0a9e6a3ef7ab65bf/lock",
    );
  });

  it("says where a cloud attempt ran, and the log mark says it was resumed", () => {
    const spot = attempt({ number: 1, instance: "aws-1a2b3c4d", backend: "aws", instance_type: "g5.xlarge", region: "us-east-1", zone: "us-east-1a", spot: true, reason: "interrupted" });
    const resumed = attempt({ number: 2, instance: "aws-5e6f7a8b", backend: "aws", instance_type: "g5.xlarge", region: "us-east-1", zone: "us-east-1b", spot: false, restored_checkpoint: 4 });
    render(<AttemptsTable attempts={[spot, resumed]} now={0} />);
    const rows = within(screen.getByRole("table")).getAllByRole("row").slice(1);
    expect(within(rows[0]).getAllByRole("cell")[1]).toHaveTextContent(/^aws-1a2b3c4dg5\.xlarge us-east-1a \(spot\)$/);
    expect(within(rows[1]).getAllByRole("cell")[1]).toHaveTextContent("aws-5e6f7a8bg5.xlarge us-east-1b (on-demand)resumed from checkpoint 4");
    expect(startLabel(resumed)).toBe(`Attempt 2 on aws-5e6f7a8b · resumed from checkpoint 4 · g5.xlarge us-east-1b (on-demand) — started ${clockTime(resumed.started_at!)}`);
  });

  it("renders nothing for a job that has no attempt yet", () => {
    const { container } = render(<AttemptsTable attempts={[]} now={0} />);
    expect(container).toBeEmptyDOMElement();
  });
});

describe("what each attempt cost", () => {
  it("shows each attempt's cost as its machine's price × the time it held it, and none for no machine", () => {
    const interrupted = attempt({ number: 1, reason: "interrupted", cost: "0.7010", price_per_hour: "2.523600", billed_seconds: 1000 });
    const resumed = attempt({ number: 2, cost: "0.0040", price_per_hour: "0.010000", billed_seconds: 1440 });
    const never = attempt({ number: 3, instance: null, reason: "no_capacity" });
    render(<AttemptsTable attempts={[interrupted, resumed, never]} now={Date.now()} />);

    const cells = screen.getAllByRole("row").slice(1).map((row) => row.querySelector(".attempt-cost"));
    expect(cells.map((cell) => cell?.textContent)).toEqual(["$0.70$2.5236/h × 16m 40s", "<$0.01$0.01/h × 24m 0s", "—"]);
    expect(cells[0]).toHaveAttribute("title", "$2.5236/h × 16m 40s held = USD 0.7010");
    expect(cells[2]).toHaveAttribute("title", "It held no machine");
  });

  it("rounds money from the decimal string, half up, with thousands separated", () => {
    expect([money("1.1834"), money("0.0050"), money("2.0050"), money("12345.6789"), money("0"), money(null)]).toEqual([
      "$1.18",
      "<$0.01",
      "$2.01",
      "$12,345.68",
      "$0.00",
      "—",
    ]);
  });
});
