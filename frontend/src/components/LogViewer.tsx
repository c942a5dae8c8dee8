// A windowed log viewer: only the rows in view (plus a margin) are in the DOM,
// every row has the same height, so 200,000 lines scroll smoothly and lines
// arriving while you read never move what you are looking at.
//
// Given `windowed`, it shows a log it holds only part of: `lines` are the
// held ones, each at row seq - 1 of `windowed.total`; a row not held asks for
// it (`onNeed`) and shows a placeholder meanwhile, and search asks the server.
//
// Wrapped, a line takes as many rows as its characters fill at the viewer's
// width (the font is monospaced), so rows are still placed by arithmetic.
// A line's number is its permalink: `#L<seq>` opens the log at that line, highlighted.
import { useCallback, useEffect, useLayoutEffect, useMemo, useRef, useState, type KeyboardEvent } from "react";
import { lineWithSeq } from "../lib/logwindow";
import { parseAnsi, renderAnsi, stripAnsi } from "./ansi";

export interface ViewerLine {
  seq: number;
  ts: number;
  stream: "o" | "e";
  text: string;
}

export interface AttemptMark {
  attempt: number;
  /**
   * The mark's row goes before `lines[lineIndex]` (after the last line when it
   * is `lines.length`): for a start mark the attempt's first line, for an end
   * mark the line after its last.
   */
  lineIndex: number;
  label: string;
  /** "start" (the default) heads an attempt's lines; "end" says how it ended. */
  kind?: "start" | "end";
}

/** A log held in part: see LogViewerProps.windowed. */
export interface WindowedLog {
  /** The log's length in seqs: line seq s is at line row s - 1. */
  total: number;
  /** The rows of seqs first..last are in view (or next to it) and not all held. */
  onNeed: (first: number, last: number) => void;
  /** The seq of the nearest line containing `text`, at or after / at or before `fromSeq`. */
  search: (text: string, fromSeq: number, direction: "next" | "prev") => Promise<number | null>;
}

export interface LogViewerProps {
  /** All lines so far; the array may grow in place (pass `version` then). */
  lines: readonly ViewerLine[];
  version?: number;
  attempts?: AttemptMark[];
  label: string;
  /** Shown when there are no lines yet. */
  placeholder?: string;
  /** The whole log as a file (the raw endpoint with download=1): a plain link, so the browser streams it to disk. */
  downloadUrl?: string;
  rowHeight?: number;
  /** A long log held in part: `lines` are a window of it, placed by seq. */
  windowed?: WindowedLog;
  /** Query parameters a line's permalink sets besides `#L<seq>` (e.g. which job). */
  linkParams?: Record<string, string>;
}

type Row = { kind: "attempt"; mark: AttemptMark } | { kind: "line"; index: number };

const OVERSCAN = 30;
const FALLBACK_VIEWPORT = 480;
// Browsers cap an element's height (Chromium near 33.5M px, Firefox near 17.9M):
// past this the scrollbar stands for the log at a scale, rows keep their height.
const MAX_CANVAS = 8_000_000;
// A server search waits this long after the last keystroke.
const SEARCH_DELAY_MS = 250;
// Where the toolbar's toggles are remembered (this browser only).
const TIMESTAMPS_KEY = "trainyard.logs.timestamps";
const WRAP_KEY = "trainyard.logs.wrap";
const TAB_WIDTH = 8;

/** The seq a `#L<seq>` hash names, else null. */
export function linkedSeq(hash: string): number | null {
  const found = /^#L(\d+)$/.exec(hash);
  const seq = found ? Number(found[1]) : 0;
  return seq >= 1 ? seq : null;
}

/** `2026-12-02T12:00:00.123Z`: a line's time in UTC, as `trainyard logs --timestamps` and the raw log print it (to the millisecond). */
export function lineStamp(ts: number): string {
  return Number.isFinite(ts) && ts > 0 ? new Date(Math.round(ts * 1000)).toISOString() : "";
}

/** How many rows of `cols` characters a line takes when wrapped (tabs to the next stop). */
export function wrappedRows(text: string, cols: number): number {
  if (cols <= 0) return 1;
  let col = 0;
  for (const char of text) col += char === "\t" ? TAB_WIDTH - (col % TAB_WIDTH) : 1;
  return Math.max(1, Math.ceil(col / cols));
}

function remembered(key: string): boolean {
  try {
    return window.localStorage.getItem(key) === "1";
  } catch {
    return false;
  }
}

function remember(key: string, on: boolean): void {
  try {
    window.localStorage.setItem(key, on ? "1" : "0");
  } catch {
    // A browser that keeps nothing just forgets the toggle.
  }
}

/** Marks in row order; at one line: by attempt, an attempt's start before its end. */
function compareMarks(a: AttemptMark, b: AttemptMark): number {
  return a.lineIndex - b.lineIndex || a.attempt - b.attempt || Number(a.kind === "end") - Number(b.kind === "end");
}

const plainCache = new WeakMap<ViewerLine, string>();

function lowerPlain(line: ViewerLine): string {
  let value = plainCache.get(line);
  if (value === undefined) {
    value = stripAnsi(line.text).toLowerCase();
    plainCache.set(line, value);
  }
  return value;
}

export function LogViewer({
  lines,
  version = lines.length,
  attempts = [],
  label,
  placeholder = "No output yet.",
  downloadUrl,
  rowHeight = 18,
  windowed,
  linkParams,
}: LogViewerProps) {
  const scroller = useRef<HTMLDivElement>(null);
  const programmaticTop = useRef<number | null>(null);
  // The line the address links to (`#L<seq>`): shown highlighted, scrolled to once it is known.
  const [linked, setLinked] = useState<number | null>(() => linkedSeq(window.location.hash));
  const jumpTo = useRef<number | null>(linked);
  const [follow, setFollow] = useState(linked === null);
  const [timestamps, setTimestamps] = useState(() => remembered(TIMESTAMPS_KEY));
  const [wrap, setWrap] = useState(() => remembered(WRAP_KEY));
  const [cols, setCols] = useState(0);
  const [scrollTop, setScrollTop] = useState(0);
  const [viewport, setViewport] = useState(FALLBACK_VIEWPORT);
  const [query, setQuery] = useState("");
  const [current, setCurrent] = useState(0);
  // Windowed search: the seq of the current match (null: none), and whether a search is running.
  const [found, setFound] = useState<{ needle: string; seq: number | null } | null>(null);
  const [searching, setSearching] = useState(false);
  const searchRun = useRef(0);

  const sortedAttempts = useMemo(
    () => [...attempts].sort(compareMarks),
    [attempts],
  );
  const lineCount = windowed ? windowed.total : lines.length;
  const rowCount = lineCount + sortedAttempts.length;
  const lineAt = (index: number): ViewerLine | undefined => (windowed ? lineWithSeq(lines, index + 1) : lines[index]);

  // Wrapped: tops[r] is the number of screen rows above row r (its last entry all of them).
  const tops = useMemo(() => {
    if (!wrap || cols <= 0) return null;
    const out = new Float64Array(rowCount + 1);
    let row = 0;
    let height = 0;
    let index = 0;
    for (const mark of sortedAttempts) {
      for (; index < Math.min(mark.lineIndex, lineCount); index += 1, row += 1) {
        out[row] = height;
        const line = windowed ? lineWithSeq(lines, index + 1) : lines[index];
        height += line ? wrappedRows(stripAnsi(line.text), cols) : 1;
      }
      out[row] = height;
      height += 1;
      row += 1;
    }
    for (; index < lineCount; index += 1, row += 1) {
      out[row] = height;
      const line = windowed ? lineWithSeq(lines, index + 1) : lines[index];
      height += line ? wrappedRows(stripAnsi(line.text), cols) : 1;
    }
    out[rowCount] = height;
    return out;
    // `version` stands for the contents of `lines`, which may grow in place.
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [wrap, cols, version, lines, sortedAttempts, lineCount, windowed === undefined]);
  const rowTop = (row: number): number => (tops ? tops[Math.min(row, rowCount)] : row) * rowHeight;
  /** The row drawn at canvas height `y` (of the log, before any scale). */
  const rowAtY = (y: number): number => {
    const unit = Math.max(0, Math.floor(y / rowHeight));
    if (!tops) return Math.min(unit, rowCount);
    let low = 0;
    let high = rowCount;
    while (low < high) {
      const middle = (low + high + 1) >> 1;
      if (tops[middle] <= unit) low = middle;
      else high = middle - 1;
    }
    return low;
  };
  const totalHeight = rowTop(rowCount);

  const rowOfLine = useCallback(
    (index: number) => index + sortedAttempts.filter((m) => m.lineIndex <= index).length,
    [sortedAttempts],
  );
  const rowAt = useCallback(
    (row: number): Row => {
      let before = 0;
      for (const mark of sortedAttempts) {
        const markRow = mark.lineIndex + before;
        if (row === markRow) return { kind: "attempt", mark };
        if (row < markRow) break;
        before += 1;
      }
      return { kind: "line", index: row - before };
    },
    [sortedAttempts],
  );

  // Search: indices of the lines that contain the query (case-insensitive).
  const needle = query.trim();
  const matches = useMemo(() => {
    if (!needle || windowed) return [] as number[];
    const lowered = needle.toLowerCase();
    const found: number[] = [];
    for (let i = 0; i < lines.length; i += 1) {
      if (lowerPlain(lines[i]).includes(lowered)) found.push(i);
    }
    return found;
    // `version` stands for the contents of `lines`, which may grow in place.
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [needle, version, lines, windowed === undefined]);
  const windowedLine = found && found.needle === needle && found.seq !== null ? found.seq - 1 : -1;
  const currentLine = windowed ? windowedLine : matches.length ? matches[Math.min(current, matches.length - 1)] : -1;

  // Measure the viewport (ResizeObserver where the browser has one).
  useLayoutEffect(() => {
    const el = scroller.current;
    if (!el) return undefined;
    const measure = () => setViewport(el.clientHeight || FALLBACK_VIEWPORT);
    measure();
    if (typeof ResizeObserver === "undefined") return undefined;
    const observer = new ResizeObserver(measure);
    observer.observe(el);
    return () => observer.disconnect();
  }, []);

  // Scroll positions are the canvas's; `top` and `maxTop` are the log's (the same below MAX_CANVAS).
  const canvasHeight = Math.min(totalHeight, MAX_CANVAS);
  const maxTop = Math.max(0, totalHeight - viewport);
  const maxScroll = Math.max(0, canvasHeight - viewport);
  const scale = maxScroll > 0 && maxTop > maxScroll ? maxTop / maxScroll : 1;
  const scrolled = follow ? maxScroll : Math.min(scrollTop, maxScroll);
  const top = follow ? maxTop : Math.min(scrolled * scale, maxTop);

  // Follow mode: keep the newest line in view as lines arrive.
  useLayoutEffect(() => {
    const el = scroller.current;
    if (!el || !follow) return;
    el.scrollTop = maxScroll;
    programmaticTop.current = el.scrollTop;
  }, [follow, maxScroll, version]);

  const onScroll = () => {
    const el = scroller.current;
    if (!el) return;
    const position = el.scrollTop;
    if (programmaticTop.current !== null && Math.abs(position - programmaticTop.current) < 1) {
      return;
    }
    programmaticTop.current = null;
    setScrollTop(position);
    const atBottom = position * scale >= maxTop - rowHeight;
    setFollow(atBottom);
  };

  // A scroll gesture upwards stops following at once, before the scroll event:
  // otherwise lines arriving in the same frame would pull the view back down.
  const onWheel = (event: { deltaY: number }) => {
    if (event.deltaY < 0 && follow) setFollow(false);
  };
  const onScrollerKey = (event: KeyboardEvent<HTMLDivElement>) => {
    if (["ArrowUp", "PageUp", "Home"].includes(event.key) && follow) setFollow(false);
  };

  const scrollToRow = (row: number, align: "top" | "third" = "third") => {
    const el = scroller.current;
    // The element's own height: on the first render the measured one is not in state yet.
    const offset = align === "top" ? 0 : (el?.clientHeight || viewport) / 3;
    const target = Math.max(0, Math.min(maxTop, rowTop(row) - offset)) / scale;
    setFollow(false);
    setScrollTop(target);
    if (el) {
      el.scrollTop = target;
      programmaticTop.current = el.scrollTop;
    }
  };

  // Windowed search: ask the server from `fromSeq`; with nothing that way, wrap around once.
  const searchFrom = async (fromSeq: number, direction: "next" | "prev") => {
    if (!windowed || !needle) return;
    const run = ++searchRun.current;
    setSearching(true);
    try {
      let seq = await windowed.search(needle, Math.max(1, fromSeq), direction);
      if (seq === null && run === searchRun.current) {
        seq = await windowed.search(needle, direction === "next" ? 1 : Math.max(1, windowed.total), direction);
      }
      if (run !== searchRun.current) return;
      setFound({ needle, seq });
      if (seq !== null) scrollToRow(rowOfLine(seq - 1));
    } catch {
      if (run === searchRun.current) setFound({ needle, seq: null });
    } finally {
      if (run === searchRun.current) setSearching(false);
    }
  };

  const goToMatch = (index: number) => {
    if (windowed) {
      const forward = index > current;
      const at = windowedLine >= 0 ? windowedLine + 1 : forward ? 0 : windowed.total + 1;
      void searchFrom(forward ? at + 1 : at - 1, forward ? "next" : "prev");
      return;
    }
    if (!matches.length) return;
    const wrapped = (index + matches.length) % matches.length;
    setCurrent(wrapped);
    scrollToRow(rowOfLine(matches[wrapped]));
  };

  const onSearchKey = (event: KeyboardEvent<HTMLInputElement>) => {
    if (event.key === "Enter") {
      event.preventDefault();
      goToMatch(current + (event.shiftKey ? -1 : 1));
    } else if (event.key === "Escape") {
      setQuery("");
    }
  };

  const onQueryChange = (value: string) => {
    setQuery(value);
    setCurrent(0);
  };

  // Jump to the first match when the query changes.
  useEffect(() => {
    if (windowed) {
      searchRun.current += 1;
      setFound(null);
      if (!needle) return undefined;
      const timer = setTimeout(() => void searchFrom(1, "next"), SEARCH_DELAY_MS);
      return () => clearTimeout(timer);
    }
    if (matches.length && needle) scrollToRow(rowOfLine(matches[0]));
    return undefined;
    // Only on a new query, not on every appended line.
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [needle]);

  // The linked line: follow the address's hash, and scroll to it once the log reaches it.
  useEffect(() => {
    const onHash = () => {
      const seq = linkedSeq(window.location.hash);
      setLinked(seq);
      jumpTo.current = seq;
      if (seq !== null) setFollow(false);
    };
    window.addEventListener("hashchange", onHash);
    return () => window.removeEventListener("hashchange", onHash);
  }, []);
  useLayoutEffect(() => {
    const seq = jumpTo.current;
    if (seq === null || seq > lineCount) return;
    jumpTo.current = null;
    scrollToRow(rowOfLine(seq - 1));
    // The page too: a log below the fold would hide the line it opened at.
    scroller.current?.scrollIntoView?.({ block: "nearest" });
    // Only when the log grows to the linked line or the link changes, not on every scroll.
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [lineCount, linked, viewport]);

  // Wrapped: the characters a text column holds, measured in the page's font.
  const measure = useRef<HTMLSpanElement>(null);
  useLayoutEffect(() => {
    const el = scroller.current;
    if (!wrap || !el) return undefined;
    const update = () => {
      const probe = measure.current;
      const text = el.querySelector<HTMLElement>(".log-row[data-seq] .log-text");
      const charWidth = probe ? probe.getBoundingClientRect().width / 10 : 0;
      if (!text || charWidth <= 0) return;
      const style = window.getComputedStyle(text);
      const width = text.clientWidth - parseFloat(style.paddingLeft || "0") - parseFloat(style.paddingRight || "0");
      setCols(Math.max(1, Math.floor(width / charWidth)));
    };
    update();
    if (typeof ResizeObserver === "undefined") return undefined;
    const observer = new ResizeObserver(update);
    observer.observe(el);
    return () => observer.disconnect();
  }, [wrap, timestamps, lineCount > 0]);

  const toggleTimestamps = () => {
    remember(TIMESTAMPS_KEY, !timestamps);
    setTimestamps(!timestamps);
  };
  const toggleWrap = () => {
    remember(WRAP_KEY, !wrap);
    setWrap(!wrap);
  };
  const linkBase = (() => {
    const query = new URLSearchParams(window.location.search);
    for (const [name, value] of Object.entries(linkParams ?? {})) query.set(name, value);
    const search = query.toString();
    return `${window.location.pathname}${search ? `?${search}` : ""}`;
  })();
  const onLink = (seq: number) => {
    window.history.replaceState(window.history.state, "", `${linkBase}#L${seq}`);
    setLinked(seq);
  };

  const first = Math.max(0, rowAtY(top) - OVERSCAN);
  const last = Math.min(rowCount, rowAtY(top + viewport) + 1 + OVERSCAN);
  const rows: Row[] = [];
  for (let row = first; row < last; row += 1) rows.push(rowAt(row));

  // Windowed: the seqs of the line rows drawn, for the owner to read those it does not hold.
  let needFirst = 0;
  let needLast = -1;
  for (const row of rows) {
    if (row.kind !== "line" || lineAt(row.index)) continue;
    if (!needFirst) needFirst = row.index + 1;
    needLast = row.index + 1;
  }
  const onNeed = windowed?.onNeed;
  useEffect(() => {
    if (onNeed && needFirst && needLast >= needFirst) onNeed(needFirst, needLast);
  }, [onNeed, needFirst, needLast, version]);

  return (
    <div className="logviewer" style={{ ["--row-h" as string]: `${rowHeight}px` }}>
      <div className="log-toolbar" role="toolbar" aria-label={`Log tools for ${label}`}>
        <label className="log-search">
          <span className="visually-hidden">Search logs</span>
          <input
            type="search"
            placeholder="Search logs"
            value={query}
            onChange={(event) => onQueryChange(event.target.value)}
            onKeyDown={onSearchKey}
          />
        </label>
        <span className="log-count" aria-live="polite">
          {windowed ? windowedCount(needle, searching, found) : needle ? (matches.length ? `${Math.min(current, matches.length - 1) + 1} / ${matches.length}` : "No matches") : ""}
        </span>
        <button type="button" className="btn btn-small" onClick={() => goToMatch(current - 1)} disabled={windowed ? !needle : !matches.length} aria-label="Previous match">
          ↑
        </button>
        <button type="button" className="btn btn-small" onClick={() => goToMatch(current + 1)} disabled={windowed ? !needle : !matches.length} aria-label="Next match">
          ↓
        </button>
        <span className="toolbar-spacer" />
        {sortedAttempts.map((mark, position) =>
          mark.kind === "end" ? null : (
            // The i-th mark sits on row lineIndex + i: one row per line and per mark above it.
            <button key={mark.attempt} type="button" className="btn btn-small" onClick={() => scrollToRow(mark.lineIndex + position, "top")}>
              Jump to attempt {mark.attempt}
            </button>
          ),
        )}
        <button
          type="button"
          className={`btn btn-small ${timestamps ? "btn-active" : ""}`}
          aria-pressed={timestamps}
          onClick={toggleTimestamps}
          title="Show each line's time (UTC)"
        >
          Timestamps
        </button>
        <button
          type="button"
          className={`btn btn-small ${wrap ? "btn-active" : ""}`}
          aria-pressed={wrap}
          onClick={toggleWrap}
          title="Wrap long lines to the viewer's width"
        >
          Wrap
        </button>
        <button
          type="button"
          className={`btn btn-small ${follow ? "btn-active" : ""}`}
          aria-pressed={follow}
          onClick={() => setFollow(true)}
          title="Keep the newest line in view"
        >
          Follow
        </button>
        {downloadUrl ? (
          <a className="btn btn-small" href={downloadUrl} download>
            Download
          </a>
        ) : null}
      </div>
      <div
        ref={scroller}
        className="log-scroll"
        role="log"
        aria-label={label}
        aria-live="off"
        tabIndex={0}
        onScroll={onScroll}
        onWheel={onWheel}
        onKeyDown={onScrollerKey}
        data-follow={follow ? "on" : "off"}
        data-wrap={wrap ? "on" : "off"}
        data-timestamps={timestamps ? "on" : "off"}
        data-held={lines.length}
        data-total={lineCount}
      >
        {wrap ? (
          <span ref={measure} className="log-measure" aria-hidden="true">
            0000000000
          </span>
        ) : null}
        <div className="log-canvas" style={{ height: Math.max(canvasHeight, rowHeight) }}>
          <div className="log-rows" style={{ transform: `translateY(${rowTop(first) - top + scrolled}px)` }}>
            {rows.map((row) =>
              row.kind === "attempt" ? (
                <div
                  key={`attempt-${row.mark.attempt}-${row.mark.kind ?? "start"}`}
                  className={`log-row log-attempt log-attempt-${row.mark.kind ?? "start"}`}
                  data-attempt={row.mark.attempt}
                  data-mark={row.mark.kind ?? "start"}
                >
                  <span className="log-gutter" />
                  <span className="log-text">{row.mark.label}</span>
                </div>
              ) : (
                <LineRow
                  key={`line-${row.index}`}
                  line={lineAt(row.index)}
                  seq={row.index + 1}
                  needle={needle}
                  current={row.index === currentLine}
                  linked={row.index + 1 === linked}
                  timestamps={timestamps}
                  height={tops ? (tops[rowOfLine(row.index) + 1] - tops[rowOfLine(row.index)]) * rowHeight : undefined}
                  href={`${linkBase}#L${row.index + 1}`}
                  onLink={onLink}
                />
              ),
            )}
          </div>
          {lineCount === 0 ? (
            <div className="log-placeholder" style={{ top: sortedAttempts.length * rowHeight + 6 }}>
              {placeholder}
            </div>
          ) : null}
        </div>
      </div>
    </div>
  );
}

/** "line 1,234", "Searching…", "No matches" or nothing: the windowed search's state. */
function windowedCount(needle: string, searching: boolean, found: { needle: string; seq: number | null } | null): string {
  if (!needle) return "";
  if (searching || !found || found.needle !== needle) return "Searching…";
  return found.seq === null ? "No matches" : `line ${found.seq.toLocaleString("en-US")}`;
}

interface LineRowProps {
  line: ViewerLine | undefined;
  seq: number;
  needle: string;
  current: boolean;
  /** The line the address links to (`#L<seq>`). */
  linked: boolean;
  timestamps: boolean;
  /** Wrapped: the row's height (the screen rows its text takes). */
  height: number | undefined;
  href: string;
  onLink: (seq: number) => void;
}

/** A held line, or the placeholder of one being read (a gap in a window reads as empty). */
function LineRow(props: LineRowProps) {
  const { line, seq, timestamps } = props;
  if (line) return <LogRow {...props} line={line} />;
  return (
    <div className="log-row log-pending" data-pending={seq}>
      <span className="log-gutter">{seq}</span>
      {timestamps ? <span className="log-ts" /> : null}
      <span className="log-text" />
    </div>
  );
}

function LogRow({ line, needle, current, linked, timestamps, height, href, onLink }: LineRowProps & { line: ViewerLine }) {
  const isErr = line.stream === "e";
  const classes = ["log-row", isErr ? "stderr" : "", current ? "log-current" : "", linked ? "log-linked" : ""].filter(Boolean).join(" ");
  return (
    <div className={classes} data-seq={line.seq} data-stream={line.stream} style={height ? { height } : undefined}>
      <span className="log-gutter" title={isErr ? "stderr" : "stdout"}>
        {isErr ? <span className="stream-mark" aria-label="stderr">E</span> : null}
        <a
          className="log-link"
          href={href}
          tabIndex={-1}
          aria-label={`Line ${line.seq}`}
          onClick={(event) => {
            event.preventDefault();
            onLink(line.seq);
          }}
        >
          {line.seq}
        </a>
      </span>
      {timestamps ? <span className="log-ts">{lineStamp(line.ts)}</span> : null}
      <span className="log-text">{renderAnsi(parseAnsi(line.text), needle, current ? "match current" : "match")}</span>
    </div>
  );
}
