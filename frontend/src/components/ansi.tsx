// ANSI escape sequences → styled spans, via anser (no hand-written parser).
import Anser from "anser";
import type { CSSProperties, ReactNode } from "react";

export interface AnsiChunk {
  text: string;
  style?: CSSProperties;
}

// anser's 16 basic colours are the xterm ones, too dark on our log background;
// these keep the same hue and read well on #0d1117.
const PALETTE: Record<string, string> = {
  "0, 0, 0": "110, 118, 129",
  "187, 0, 0": "255, 123, 114",
  "0, 187, 0": "63, 185, 80",
  "187, 187, 0": "210, 153, 34",
  "0, 0, 187": "88, 166, 255",
  "187, 0, 187": "188, 140, 255",
  "0, 187, 187": "57, 197, 207",
  "255, 255, 255": "240, 246, 252",
  "85, 85, 85": "139, 148, 158",
  "255, 85, 85": "255, 161, 152",
  "0, 255, 0": "86, 211, 100",
  "255, 255, 85": "227, 179, 65",
  "85, 85, 255": "121, 192, 255",
  "255, 85, 255": "210, 168, 255",
  "85, 255, 255": "86, 212, 221",
};

const cache = new Map<string, AnsiChunk[]>();
const CACHE_LIMIT = 5000;

// eslint-disable-next-line no-control-regex
const ANSI_PATTERN = /\u001b\[[0-9;?]*[ -/]*[@-~]|\u001b\][^\u0007\u001b]*(?:\u0007|\u001b\\)|\u001b[@-Z\\-_]/g;

/** The text a person sees: escape sequences removed. */
export function stripAnsi(text: string): string {
  return text.includes("\u001b") ? text.replace(ANSI_PATTERN, "") : text;
}

/** Split `text` into chunks of one style each (memoised: visible rows re-render often). */
export function parseAnsi(text: string): AnsiChunk[] {
  if (!text.includes("\u001b")) return [{ text }];
  const hit = cache.get(text);
  if (hit) return hit;
  const chunks = Anser.ansiToJson(text, { remove_empty: true }).map(toChunk);
  if (cache.size >= CACHE_LIMIT) cache.clear();
  cache.set(text, chunks);
  return chunks;
}

/**
 * Render chunks as spans, wrapping the case-insensitive matches of `needle`
 * in <mark> (the matches may cross style boundaries).
 */
export function renderAnsi(chunks: AnsiChunk[], needle = "", markClass = "match"): ReactNode[] {
  const ranges = needle ? findRanges(chunks.map((c) => c.text).join(""), needle) : [];
  const out: ReactNode[] = [];
  let offset = 0;
  chunks.forEach((chunk, index) => {
    const pieces = splitByRanges(chunk.text, offset, ranges, markClass, `${index}`);
    offset += chunk.text.length;
    out.push(
      chunk.style ? (
        <span key={index} className="ansi" style={chunk.style}>
          {pieces}
        </span>
      ) : (
        <span key={index}>{pieces}</span>
      ),
    );
  });
  return out;
}

export function AnsiText({ text, needle }: { text: string; needle?: string }) {
  return <>{renderAnsi(parseAnsi(text), needle)}</>;
}

function toChunk(entry: Anser.AnserJsonEntry): AnsiChunk {
  const style: CSSProperties = {};
  let fg = entry.fg_truecolor || entry.fg;
  let bg = entry.bg_truecolor || entry.bg;
  if ((entry as { isInverted?: boolean }).isInverted || entry.decorations.includes("reverse")) {
    [fg, bg] = [bg || "13, 17, 23", fg || "230, 237, 243"];
  }
  if (fg) style.color = `rgb(${PALETTE[fg] ?? fg})`;
  if (bg) style.backgroundColor = `rgb(${PALETTE[bg] ?? bg})`;
  const decorations = entry.decorations ?? [];
  if (decorations.includes("bold")) style.fontWeight = 600;
  if (decorations.includes("dim")) style.opacity = 0.7;
  if (decorations.includes("italic")) style.fontStyle = "italic";
  const lines = [
    decorations.includes("underline") ? "underline" : "",
    decorations.includes("strikethrough") ? "line-through" : "",
  ].filter(Boolean);
  if (lines.length) style.textDecoration = lines.join(" ");
  if (decorations.includes("hidden")) style.visibility = "hidden";
  return Object.keys(style).length ? { text: entry.content, style } : { text: entry.content };
}

function findRanges(text: string, needle: string): [number, number][] {
  const haystack = text.toLowerCase();
  const lowered = needle.toLowerCase();
  const ranges: [number, number][] = [];
  let from = haystack.indexOf(lowered);
  while (from !== -1 && lowered) {
    ranges.push([from, from + lowered.length]);
    from = haystack.indexOf(lowered, from + lowered.length);
  }
  return ranges;
}

function splitByRanges(
  text: string,
  offset: number,
  ranges: [number, number][],
  markClass: string,
  keyPrefix: string,
): ReactNode[] {
  if (!ranges.length) return [text];
  const end = offset + text.length;
  const out: ReactNode[] = [];
  let cursor = offset;
  for (const [start, stop] of ranges) {
    if (stop <= cursor || start >= end) continue;
    const a = Math.max(start, cursor);
    const b = Math.min(stop, end);
    if (a > cursor) out.push(text.slice(cursor - offset, a - offset));
    out.push(
      <mark key={`${keyPrefix}-${a}`} className={markClass}>
        {text.slice(a - offset, b - offset)}
      </mark>,
    );
    cursor = b;
  }
  if (cursor < end) out.push(text.slice(cursor - offset));
  return out;
}
