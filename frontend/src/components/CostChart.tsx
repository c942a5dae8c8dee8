// Spending per day, week or month as bars, drawn in SVG: shapes and their
// sizes are attributes, never style, so the chart keeps to the page's
// Content-Security-Policy, and it reads as text in a test DOM and to a
// screen reader (each bar's <title>, and a table of the same numbers).
import type { Bucket } from "../lib/costs";
import { money } from "../lib/format";

const WIDTH = 760;
const HEIGHT = 220;
const LEFT = 56;
const RIGHT = 8;
const TOP = 12;
const BOTTOM = 28;

/** A round axis top at or above `max` dollars, and its step (1, 2 or 5 × a power of ten). */
export function axisScale(max: number): { top: number; step: number } {
  if (max <= 0) return { top: 1, step: 0.25 };
  const rough = max / 4;
  const power = 10 ** Math.floor(Math.log10(rough));
  const step = [1, 2, 5, 10].map((m) => m * power).find((s) => s >= rough) ?? 10 * power;
  return { top: Math.ceil(max / step) * step, step };
}

function tickLabel(value: number, step: number): string {
  if (step >= 1) return `$${value.toLocaleString("en-US", { maximumFractionDigits: 0 })}`;
  return `$${value.toFixed(2)}`;
}

export function CostChart({ buckets, caption }: { buckets: Bucket[]; caption: string }) {
  const values = buckets.map((b) => Number(b.cost));
  const { top, step } = axisScale(Math.max(0, ...values));
  const plotWidth = WIDTH - LEFT - RIGHT;
  const plotHeight = HEIGHT - TOP - BOTTOM;
  const slot = plotWidth / Math.max(1, buckets.length);
  const barWidth = Math.max(2, Math.min(48, slot * 0.7));
  const y = (value: number) => TOP + plotHeight - (value / top) * plotHeight;
  const ticks: number[] = [];
  for (let i = 0; i * step <= top + step / 2; i += 1) ticks.push(i * step);
  // At most ~12 labels under the bars: every n-th one.
  const every = Math.max(1, Math.ceil(buckets.length / 12));

  return (
    <figure className="cost-chart" aria-label={caption}>
      <svg viewBox={`0 0 ${WIDTH} ${HEIGHT}`} role="img" aria-label={caption} className="cost-chart-svg">
        {ticks.map((tick) => (
          <g key={tick}>
            <line x1={LEFT} x2={WIDTH - RIGHT} y1={y(tick)} y2={y(tick)} className="cost-chart-grid" />
            <text x={LEFT - 8} y={y(tick) + 4} textAnchor="end" className="cost-chart-tick">
              {tickLabel(tick, step)}
            </text>
          </g>
        ))}
        {buckets.map((bucket, i) => {
          const value = values[i];
          const x = LEFT + i * slot + (slot - barWidth) / 2;
          const height = Math.max(value > 0 ? 1.5 : 0, y(0) - y(value));
          return (
            <g key={bucket.key} className="cost-chart-bar" data-key={bucket.key} data-cost={bucket.cost}>
              <rect x={LEFT + i * slot} y={TOP} width={slot} height={plotHeight} className="cost-chart-hit">
                <title>{`${bucket.label}: ${money(bucket.cost)}`}</title>
              </rect>
              <rect x={x} y={y(0) - height} width={barWidth} height={height} rx={Math.min(3, barWidth / 4)} className="cost-chart-fill" />
              {i % every === 0 ? (
                <text x={x + barWidth / 2} y={HEIGHT - 8} textAnchor="middle" className="cost-chart-tick">
                  {bucket.label}
                </text>
              ) : null}
            </g>
          );
        })}
        <line x1={LEFT} x2={WIDTH - RIGHT} y1={y(0)} y2={y(0)} className="cost-chart-axis" />
      </svg>
    </figure>
  );
}
