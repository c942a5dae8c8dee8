import type { RunCode } from "../api/types";

const UNITS = ["B", "KB", "MB", "GB", "TB", "PB"];

/** 1536 → "1.5 KB" (powers of 1024, like `du -h`). */
export function humanBytes(bytes: number | null | undefined): string {
  if (bytes === null || bytes === undefined || Number.isNaN(bytes)) return "—";
  let value = bytes;
  let unit = 0;
  while (value >= 1024 && unit < UNITS.length - 1) {
    value /= 1024;
    unit += 1;
  }
  const digits = unit === 0 || value >= 100 ? 0 : 1;
  return `${value.toFixed(digits)} ${UNITS[unit]}`;
}

/**
 * The API's decimal USD string as money: "1.1834" → "$1.18", rounded half up
 * from the string itself (no float); below a cent but not nothing "<$0.01";
 * unknown (null) "—".
 */
export function money(amount: string | null | undefined): string {
  if (amount === null || amount === undefined || !/^\d+(\.\d+)?$/.test(amount)) return "—";
  const [whole, fraction = ""] = amount.split(".");
  const tenThousandths = BigInt(whole) * 10000n + BigInt((fraction + "0000").slice(0, 4));
  if (tenThousandths > 0n && tenThousandths < 100n) return "<$0.01";
  const cents = (tenThousandths + 50n) / 100n;
  const dollars = (cents / 100n).toString().replace(/\B(?=(\d{3})+(?!\d))/g, ",");
  return `$${dollars}.${(cents % 100n).toString().padStart(2, "0")}`;
}

/** 3725 → "1h 2m", 42.3 → "42s", 0.2 → "0.2s". */
export function humanDuration(seconds: number | null | undefined): string {
  if (seconds === null || seconds === undefined || Number.isNaN(seconds)) return "—";
  if (seconds < 10) return `${Math.max(0, seconds).toFixed(1)}s`;
  const s = Math.round(seconds);
  const days = Math.floor(s / 86400);
  const hours = Math.floor((s % 86400) / 3600);
  const minutes = Math.floor((s % 3600) / 60);
  const secs = s % 60;
  if (days) return `${days}d ${hours}h`;
  if (hours) return `${hours}h ${minutes}m`;
  if (minutes) return `${minutes}m ${secs}s`;
  return `${secs}s`;
}

const RELATIVE = new Intl.RelativeTimeFormat("en", { numeric: "auto" });
const STEPS: [Intl.RelativeTimeFormatUnit, number][] = [
  ["year", 365 * 86400],
  ["month", 30 * 86400],
  ["week", 7 * 86400],
  ["day", 86400],
  ["hour", 3600],
  ["minute", 60],
];

/** "3 minutes ago", "just now". */
export function relativeTime(iso: string | null | undefined, now: number = Date.now()): string {
  if (!iso) return "—";
  const seconds = (new Date(iso).getTime() - now) / 1000;
  const abs = Math.abs(seconds);
  if (abs < 45) return "just now";
  for (const [unit, size] of STEPS) {
    if (abs >= size) return RELATIVE.format(Math.round(seconds / size), unit);
  }
  return RELATIVE.format(Math.round(seconds / 60), "minute");
}

export function absoluteTime(iso: string | null | undefined): string {
  if (!iso) return "";
  return new Date(iso).toLocaleString();
}

/** Seconds a run or job has taken so far (live for unfinished ones). */
export function elapsedSeconds(
  started: string | null,
  finished: string | null,
  now: number = Date.now(),
): number | null {
  if (!started) return null;
  const end = finished ? new Date(finished).getTime() : now;
  return (end - new Date(started).getTime()) / 1000;
}

/** "https://github.com/me/repo.git" → "me/repo". */
export function repoName(url: string | undefined): string {
  if (!url) return "";
  const cleaned = url.replace(/\.git$/, "").replace(/\/+$/, "");
  const match = cleaned.match(/[:/]([^/:]+\/[^/:]+)$/);
  return match ? match[1] : cleaned;
}

/** "me/repo@1a2b3c4", "local archive", "+ patch" when uncommitted changes were sent. */
export function codeLabel(code: RunCode | undefined): string {
  if (!code) return "—";
  if (code.kind === "archive") return "working tree (archive)";
  const repo = repoName(code.repo_url) || "git";
  const commit = code.commit ? `@${code.commit.slice(0, 7)}` : "";
  return `${repo}${commit}${code.has_patch ? " + patch" : ""}`;
}

export function shortHash(hash: string, length = 12): string {
  return hash.slice(0, length);
}
