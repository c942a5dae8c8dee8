// The Costs page's arithmetic: periods as UTC windows, exact sums of the
// API's decimal USD strings (in ten-thousandths of a dollar, never floats),
// and the report's day rows summed into the chart's weeks or months.

/** The periods the page offers; a calendar month is a UTC month (docs/COST.md). */
export type Period = "this-month" | "last-month" | "7d" | "30d" | "90d";
export type Grouping = "day" | "week" | "month";

export const PERIODS: { value: Period; label: string }[] = [
  { value: "this-month", label: "This month" },
  { value: "last-month", label: "Last month" },
  { value: "7d", label: "Last 7 days" },
  { value: "30d", label: "Last 30 days" },
  { value: "90d", label: "Last 90 days" },
];

export interface Window {
  /** The first instant counted (what the API's `since` gets). */
  since: Date;
  /** The end, exclusive; null: now (the API's default). */
  until: Date | null;
}

const DAY_MS = 86_400_000;

/** The UTC window of `period` at `now`. */
export function periodWindow(period: Period, now: Date = new Date()): Window {
  const monthStart = new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth(), 1));
  switch (period) {
    case "this-month":
      return { since: monthStart, until: null };
    case "last-month":
      return { since: new Date(Date.UTC(now.getUTCFullYear(), now.getUTCMonth() - 1, 1)), until: monthStart };
    default:
      return { since: new Date(now.getTime() - Number.parseInt(period, 10) * DAY_MS), until: null };
  }
}

/** The API's decimal string → ten-thousandths of a dollar (the API's precision); null and junk → 0. */
export function units(amount: string | null | undefined): bigint {
  if (!amount || !/^\d+(\.\d+)?$/.test(amount)) return 0n;
  const [whole, fraction = ""] = amount.split(".");
  return BigInt(whole) * 10000n + BigInt((fraction + "0000").slice(0, 4));
}

/** Ten-thousandths of a dollar → the API's decimal string ("12.3400"). */
export function decimal(tenThousandths: bigint): string {
  return `${tenThousandths / 10000n}.${(tenThousandths % 10000n).toString().padStart(4, "0")}`;
}

/** `part` as a percentage of `whole`, one decimal; 0 when the whole is nothing. */
export function share(part: string, whole: string): number {
  const of = units(whole);
  if (of === 0n) return 0;
  return Number((units(part) * 1000n) / of) / 10;
}

export interface Bucket {
  /** The day, the week's Monday (YYYY-MM-DD) or the month (YYYY-MM). */
  key: string;
  /** What the axis says: "Dec 3", "Dec 1–7", "Dec 2026". */
  label: string;
  cost: string;
}

const MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];

function isoDay(date: Date): string {
  return date.toISOString().slice(0, 10);
}

function utcDay(key: string): Date {
  return new Date(`${key}T00:00:00Z`);
}

/** The key of the bucket a UTC day falls in: itself, its week's Monday, its month. */
export function bucketOf(day: string, grouping: Grouping): string {
  if (grouping === "day") return day;
  if (grouping === "month") return day.slice(0, 7);
  const date = utcDay(day);
  const sinceMonday = (date.getUTCDay() + 6) % 7;
  return isoDay(new Date(date.getTime() - sinceMonday * DAY_MS));
}

function labelOf(key: string, grouping: Grouping): string {
  if (grouping === "month") return `${MONTHS[Number(key.slice(5, 7)) - 1]} ${key.slice(0, 4)}`;
  const start = utcDay(key);
  const first = `${MONTHS[start.getUTCMonth()]} ${start.getUTCDate()}`;
  if (grouping === "day") return first;
  const end = new Date(start.getTime() + 6 * DAY_MS);
  return end.getUTCMonth() === start.getUTCMonth()
    ? `${first}–${end.getUTCDate()}`
    : `${first} – ${MONTHS[end.getUTCMonth()]} ${end.getUTCDate()}`;
}

/**
 * The report's day rows (`by=day`: key YYYY-MM-DD) summed into `grouping`'s
 * buckets, every bucket of the window present (a day without attempts is a
 * $0.00 bar, not a gap), in date order.
 */
export function buckets(days: { key: string; cost: string }[], grouping: Grouping, window: Window, now: Date = new Date()): Bucket[] {
  const sums = new Map<string, bigint>();
  const last = new Date((window.until ?? now).getTime() - 1);
  for (let day = utcDay(isoDay(window.since)); day <= last; day = new Date(day.getTime() + DAY_MS)) {
    const key = bucketOf(isoDay(day), grouping);
    if (!sums.has(key)) sums.set(key, 0n);
  }
  for (const row of days) {
    const key = bucketOf(row.key, grouping);
    sums.set(key, (sums.get(key) ?? 0n) + units(row.cost));
  }
  return [...sums.entries()]
    .sort(([a], [b]) => a.localeCompare(b))
    .map(([key, sum]) => ({ key, label: labelOf(key, grouping), cost: decimal(sum) }));
}
