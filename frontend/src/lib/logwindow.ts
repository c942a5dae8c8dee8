// The run page's log lines: for each job a bounded window of its log, not
// the whole of it (docs/decisions/0053-windowed-log-viewer.md). A job's
// window opens at the tail (…/logs/?tail=), grows or moves as the viewer
// asks for rows it does not hold (after_seq / before_seq), takes the lines
// the follow socket sends while it reaches the end, and drops the lines
// farthest from what is in view past WINDOW_LINES.
import type { ViewerLine } from "../components/LogViewer";
import type { Stream } from "../api/types";

/** The most lines held per job (the viewer shows a few dozen of them). */
export const WINDOW_LINES = 20_000;
/** Lines it opens with (the tail): a few screens, so the first answer is small and quick. */
export const OPEN_LINES = 1_000;
/** Lines per request as the user scrolls or jumps. */
export const CHUNK_LINES = 5_000;
/** After a failed request, wait this long before asking again. */
const RETRY_MS = 3_000;

export type Direction = "next" | "prev";

export interface WindowPage {
  lines: { seq: number; ts: string | number; stream: Stream; text: string }[];
  has_more: boolean;
  last_seq: number;
}

/** Where the lines come from: the REST API in the app, a fake in tests. */
export interface LogSource {
  page(job: string, query: { after_seq?: number; before_seq?: number; tail?: number; limit?: number }): Promise<WindowPage>;
  search(job: string, text: string, fromSeq: number, direction: Direction): Promise<number | null>;
}

export interface JobWindow {
  /** Lines in seq order: every stored line with fromSeq ≤ seq ≤ toSeq. */
  readonly lines: ViewerLine[];
  readonly fromSeq: number;
  readonly toSeq: number;
  /** The log's length in seqs as far as it is known: the viewer's rows. */
  readonly total: number;
  readonly loaded: boolean;
  readonly error: string | null;
}

interface MutableWindow {
  lines: ViewerLine[];
  fromSeq: number;
  toSeq: number;
  total: number;
  /** The highest seq the socket sent: stored lines the window may not hold. */
  liveMax: number;
  loaded: boolean;
  pending: boolean;
  retryAt: number;
  error: string | null;
}

export class LogWindowStore {
  private readonly jobs = new Map<string, MutableWindow>();
  private readonly listeners = new Set<() => void>();
  private readonly source: LogSource;
  version = 0;

  constructor(source: LogSource) {
    this.source = source;
  }

  subscribe = (listener: () => void): (() => void) => {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  };

  getVersion = (): number => this.version;

  window(job: string): JobWindow {
    return this.get(job);
  }

  /** Lines held across all jobs (what the page keeps in memory). */
  held(): number {
    let count = 0;
    this.jobs.forEach((w) => (count += w.lines.length));
    return count;
  }

  /** The job's watermark from the run: sizes the log before its tail is read. */
  observe(job: string, lastSeq: number): void {
    const w = this.get(job);
    if (w.loaded || lastSeq <= w.total) return;
    w.total = lastSeq;
    this.changed();
  }

  /** Where the follow socket should start this job's lines (its `job_after`). */
  resumeSeq(job: string): number {
    const w = this.get(job);
    return w.loaded && w.toSeq >= w.total ? w.toSeq : Math.max(w.total, w.liveMax);
  }

  /** Lines from the follow socket: kept when they continue the window, else only counted. */
  append(job: string, incoming: [number, number, Stream, string][]): void {
    if (!incoming.length) return;
    const w = this.get(job);
    const continues = w.loaded && (w.toSeq >= w.total || incoming[0][0] <= w.toSeq + 1);
    if (continues) {
      for (const [seq, ts, stream, text] of incoming) {
        if (seq <= w.toSeq) continue;
        w.lines.push({ seq, ts, stream, text });
        w.toSeq = seq;
      }
      trimHead(w);
    }
    w.liveMax = Math.max(w.liveMax, incoming[incoming.length - 1][0]);
    w.total = Math.max(w.total, w.liveMax);
    this.changed();
  }

  /**
   * The viewer shows seqs first..last: read what the window lacks of them.
   * 1. Not read yet: the tail.
   * 2. Just past the window's end: the lines after it (the head is dropped).
   * 3. Just before its start: the lines before it (the end is dropped).
   * 4. Elsewhere (a jump): a new window around the range.
   */
  need(job: string, first: number, last: number): void {
    const w = this.get(job);
    if (w.pending || Date.now() < w.retryAt) return;
    if (!w.loaded) {
      void this.load(job, w, { tail: OPEN_LINES }, (page) => this.opened(w, page));
      return;
    }
    const wantedLast = Math.min(last, w.total);
    const wantedFirst = Math.max(1, first);
    if (wantedFirst > wantedLast || (wantedFirst >= w.fromSeq && wantedLast <= w.toSeq)) return;
    if (wantedFirst >= w.fromSeq && wantedFirst <= w.toSeq + 1) {
      void this.load(job, w, { after_seq: w.toSeq, limit: CHUNK_LINES }, (page) => this.extended(w, page));
    } else if (wantedLast <= w.toSeq && wantedLast >= w.fromSeq - 1) {
      void this.load(job, w, { before_seq: w.fromSeq, limit: CHUNK_LINES }, (page) => this.prepended(w, page));
    } else {
      const after = Math.max(0, wantedFirst - 1 - Math.floor((CHUNK_LINES - (wantedLast - wantedFirst + 1)) / 2));
      void this.load(job, w, { after_seq: after, limit: CHUNK_LINES }, (page) => this.moved(w, after, page));
    }
  }

  /** The seq of the nearest line containing `text` (the server searches the whole log). */
  search(job: string, text: string, fromSeq: number, direction: Direction): Promise<number | null> {
    return this.source.search(job, text, fromSeq, direction);
  }

  private get(job: string): MutableWindow {
    let w = this.jobs.get(job);
    if (!w) {
      w = { lines: [], fromSeq: 1, toSeq: 0, total: 0, liveMax: 0, loaded: false, pending: false, retryAt: 0, error: null };
      this.jobs.set(job, w);
    }
    return w;
  }

  private async load(job: string, w: MutableWindow, query: Parameters<LogSource["page"]>[1], apply: (page: WindowPage) => void) {
    w.pending = true;
    try {
      const page = await this.source.page(job, query);
      w.error = null;
      apply(page);
    } catch (caught) {
      w.error = caught instanceof Error ? caught.message : String(caught);
      w.retryAt = Date.now() + RETRY_MS;
    } finally {
      w.pending = false;
      this.changed();
    }
  }

  private opened(w: MutableWindow, page: WindowPage): void {
    w.lines = page.lines.map(toLine);
    const end = w.lines.length ? w.lines[w.lines.length - 1].seq : 0;
    w.fromSeq = page.has_more && w.lines.length ? w.lines[0].seq : 1;
    w.toSeq = end;
    // The stored end, not the watermark: a job past its log cap counted lines it did not store.
    w.total = Math.max(end, w.liveMax);
    w.loaded = true;
  }

  private extended(w: MutableWindow, page: WindowPage): void {
    for (const line of page.lines) if (line.seq > w.toSeq) w.lines.push(toLine(line));
    const end = w.lines.length ? w.lines[w.lines.length - 1].seq : w.toSeq;
    w.toSeq = page.has_more ? end : Math.max(end, w.toSeq);
    if (!page.has_more) w.total = Math.max(w.toSeq, w.liveMax);
    trimHead(w);
  }

  private prepended(w: MutableWindow, page: WindowPage): void {
    const before = page.lines.filter((line) => line.seq < w.fromSeq).map(toLine);
    w.lines = before.concat(w.lines);
    w.fromSeq = page.has_more && before.length ? before[0].seq : 1;
    if (w.lines.length > WINDOW_LINES) {
      w.lines.length = WINDOW_LINES;
      w.toSeq = w.lines[w.lines.length - 1].seq;
    }
  }

  private moved(w: MutableWindow, after: number, page: WindowPage): void {
    w.lines = page.lines.map(toLine);
    w.fromSeq = after + 1;
    const end = w.lines.length ? w.lines[w.lines.length - 1].seq : after;
    w.toSeq = end;
    if (!page.has_more) w.total = Math.max(end, w.liveMax);
  }

  private changed(): void {
    this.version += 1;
    this.listeners.forEach((listener) => listener());
  }
}

function trimHead(w: MutableWindow): void {
  const excess = w.lines.length - WINDOW_LINES;
  if (excess <= 0) return;
  w.lines.splice(0, excess);
  w.fromSeq = w.lines[0].seq;
}

function toLine(line: WindowPage["lines"][number]): ViewerLine {
  return { seq: line.seq, ts: Number(line.ts), stream: line.stream, text: line.text };
}

/** The line with `seq` among `lines` (in seq order), if held: direct when the seqs have no gap. */
export function lineWithSeq(lines: readonly ViewerLine[], seq: number): ViewerLine | undefined {
  if (!lines.length) return undefined;
  const guess = lines[seq - lines[0].seq];
  if (guess && guess.seq === seq) return guess;
  let low = 0;
  let high = lines.length - 1;
  while (low <= high) {
    const middle = (low + high) >> 1;
    const found = lines[middle].seq;
    if (found === seq) return lines[middle];
    if (found < seq) low = middle + 1;
    else high = middle - 1;
  }
  return undefined;
}
