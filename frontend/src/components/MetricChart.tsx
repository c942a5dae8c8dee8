// One chart of metric lines, drawn by uPlot on a canvas. uPlot styles its
// elements through the CSSOM (element.style), never with <style> elements or
// style attributes in markup, so it keeps to the page's Content-Security-Policy;
// its stylesheet is bundled with the app's own. Attempt boundaries are drawn on
// the canvas after the lines. The legend (values under the cursor, else the
// newest) is React's, so it reads as text.
import { useEffect, useMemo, useRef, useState, type ReactNode } from "react";
import uPlot from "uplot";
import "uplot/dist/uPlot.min.css";
import { formatValue, trimmed, type Aligned, type Mark } from "../lib/metrics";
import { humanDuration } from "../lib/format";

export interface ChartLine {
  label: string;
  color: string;
  /** Canvas line dash, e.g. [4, 3]. */
  dash?: number[];
}

export type XKind = "time" | "step" | "elapsed";

export interface MetricChartProps {
  title: string;
  unit: string;
  xKind: XKind;
  lines: ChartLine[];
  /** One y column per line; with `band`, two more: the first line's min and max. */
  data: Aligned;
  band?: boolean;
  marks?: Mark[];
  /** The y axis reaches at least this far (a GPU's memory, a disk's size). */
  yCeiling?: number | null;
  /** The x range shown (a zoom, or the whole run); null: the data's own. */
  xRange?: [number, number] | null;
  /** A drag over the chart asks for that x range, a double click for all of it: given, the page decides (and passes `xRange`); else the chart keeps its own zoom. */
  onZoom?: (range: [number, number] | null) => void;
  /** Charts with the same key move their cursors together. */
  syncKey?: string;
  height?: number;
  children?: ReactNode;
}

const NO_MARKS: Mark[] = [];
const AXIS = "#66666e";
const GRID = "#f0f0f2";
const RED = "#c62828";
const GREY = "#71717a";

const BYTE_UNITS = new Set(["B", "B/s", "bytes", "bytes/s"]);
/** Tick steps for bytes: 1, 2, 4 … 512 of each power of 1024, so ticks read 256 MB, 512 MB, 1 GB. */
const BINARY_INCREMENTS = [0, 1, 2, 3, 4, 5].flatMap((power) => [1, 2, 4, 8, 16, 32, 64, 128, 256, 512].map((m) => m * 1024 ** power));

let canvasChecked: boolean | null = null;

/** Whether this browser draws on a canvas (a test DOM does not). */
function canvasWorks(): boolean {
  if (canvasChecked === null) {
    try {
      canvasChecked = typeof HTMLCanvasElement !== "undefined" && !/jsdom/i.test(navigator.userAgent) && document.createElement("canvas").getContext("2d") !== null;
    } catch {
      canvasChecked = false;
    }
  }
  return canvasChecked;
}

/** An x value as the axis and legend say it. */
export function formatX(kind: XKind, x: number): string {
  if (kind === "time") return new Date(x * 1000).toLocaleString(undefined, { month: "short", day: "numeric", hour: "2-digit", minute: "2-digit", second: "2-digit" });
  if (kind === "elapsed") return humanDuration(x);
  return `step ${trimmed(x)}`;
}

function rangeKey(range: [number, number] | null, data: Aligned): string {
  if (range) return `${range[0]}:${range[1]}`;
  return data.x.length ? `${data.x[0]}:${data.x[data.x.length - 1]}` : "";
}

function latestIndex(column: (number | null)[]): number | null {
  for (let i = column.length - 1; i >= 0; i -= 1) if (column[i] !== null && column[i] !== undefined) return i;
  return null;
}

function pointsIn(data: Aligned, lines: number): number {
  let n = 0;
  for (let l = 0; l < lines; l += 1) for (const v of data.ys[l] ?? []) if (v !== null && v !== undefined) n += 1;
  return n;
}

export function MetricChart(props: MetricChartProps) {
  const { title, unit, xKind, lines, data, band = false, marks = NO_MARKS, yCeiling = null, onZoom, syncKey, height = 170, children } = props;
  // A chart the page does not zoom keeps its own zoom, so that new points do not reset it.
  const [ownZoom, setOwnZoom] = useState<[number, number] | null>(null);
  const zoomTo = onZoom ?? setOwnZoom;
  const xRange = onZoom ? (props.xRange ?? null) : ownZoom;
  const holder = useRef<HTMLDivElement>(null);
  const plot = useRef<uPlot | null>(null);
  // What the chart was last given: an effect that would hand it the same again does nothing (no extra redraw).
  const given = useRef<{ data: Aligned | null; range: string; marks: Mark[] | null; ceiling: number | null }>({
    data: null,
    range: "",
    marks: null,
    ceiling: null,
  });
  const [cursor, setCursor] = useState<number | null>(null);
  const drawable = canvasWorks();

  // What the hooks read: the newest props, without rebuilding the chart.
  const live = useRef({ marks, yCeiling, xRange, zoomTo, unit, xKind });
  live.current = { marks, yCeiling, xRange, zoomTo, unit, xKind };

  const structure = useMemo(
    () => JSON.stringify({
        xKind,
        unit,
        band,
        marked: marks.length > 0,
        sync: syncKey ?? null,
        lines: lines.map((l) => [l.label, l.color, l.dash ?? null]),
      }),
    [xKind, unit, band, marks.length, syncKey, lines],
  );

  useEffect(() => {
    const element = holder.current;
    if (!element || !drawable) return undefined;
    const series: uPlot.Series[] = [
      {},
      ...lines.map((line) => ({ label: line.label, stroke: line.color, width: 1.5, dash: line.dash, spanGaps: false, points: { show: false } })),
    ];
    const bands: uPlot.Band[] = [];
    if (band) {
      const fill = `${lines[0]?.color ?? "#4e79a7"}26`;
      series.push({ label: "min", stroke: "transparent", points: { show: false } }, { label: "max", stroke: "transparent", points: { show: false } });
      bands.push({ series: [lines.length + 2, lines.length + 1], fill });
    }
    const options: uPlot.Options = {
      width: Math.max(200, element.clientWidth),
      height,
      legend: { show: false },
      series,
      bands,
      // Room above the plot for the attempt marks' labels, so they never cover a line.
      padding: [marks.length ? 20 : 8, 12, 0, 0],
      cursor: {
        sync: syncKey ? { key: syncKey } : undefined,
        drag: { x: true, y: false, setScale: false },
        points: { size: 6 },
      },
      scales: {
        x: {
          time: xKind === "time",
          // New data re-ranges x (uPlot keeps the old range without this).
          auto: true,
          range: (_u, min, max) => live.current.xRange ?? [min, max],
        },
        y: {
          range: (_u, min, max) => {
            const ceiling = live.current.yCeiling;
            const low = Math.min(0, min);
            let high = Math.max(max, ceiling ?? max);
            if (live.current.unit === "%" && high <= 100) high = 100;
            if (high === low) high = low + 1;
            return min < 0 || live.current.unit === "" ? uPlot.rangeNum(min, max, 0.1, true) : [low, high * 1.05];
          },
        },
      },
      axes: [
        {
          stroke: AXIS,
          grid: { stroke: GRID, width: 1 },
          ticks: { stroke: GRID, width: 1 },
          font: "11px system-ui, sans-serif",
          values: xKind === "time" ? undefined : (_u, splits) => splits.map((v) => (xKind === "elapsed" ? humanDuration(v) : trimmed(v))),
        },
        {
          stroke: AXIS,
          grid: { stroke: GRID, width: 1 },
          ticks: { stroke: GRID, width: 1 },
          font: "11px system-ui, sans-serif",
          size: 64,
          incrs: BYTE_UNITS.has(unit) ? BINARY_INCREMENTS : undefined,
          values: (_u, splits) => splits.map((v) => formatValue(v, live.current.unit)),
        },
      ],
      hooks: {
        setCursor: [(u) => setCursor(u.cursor.idx ?? null)],
        setSelect: [
          (u) => {
            if (u.select.width < 4) return;
            const from = u.posToVal(u.select.left, "x");
            const to = u.posToVal(u.select.left + u.select.width, "x");
            u.setSelect({ left: 0, top: 0, width: 0, height: 0 }, false);
            live.current.zoomTo([from, to]);
          },
        ],
        draw: [
          (u) => {
            drawMarks(u, live.current.marks);
            // How many times the canvas was painted with data: what a browser test waits for.
            if (u.data[0]?.length) element.dataset.drawn = String(Number(element.dataset.drawn ?? 0) + 1);
          },
        ],
      },
    };
    const made = new uPlot(options, [data.x, ...data.ys] as uPlot.AlignedData, element);
    plot.current = made;
    given.current = { data, range: rangeKey(xRange, data), marks, ceiling: yCeiling };
    const reset = () => live.current.zoomTo(null);
    made.over.addEventListener("dblclick", reset);
    let width = options.width;
    const resized = new ResizeObserver(() => {
      const now = Math.max(200, element.clientWidth);
      if (now === width) return;
      width = now;
      made.setSize({ width, height });
    });
    resized.observe(element);
    return () => {
      resized.disconnect();
      made.over.removeEventListener("dblclick", reset);
      made.destroy();
      plot.current = null;
    };
    // The chart is rebuilt only when its structure changes; data, marks and ranges are set on it below.
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [structure, drawable, height]);

  useEffect(() => {
    const made = plot.current;
    if (!made || given.current.data === data) return;
    given.current.data = data;
    made.setData([data.x, ...data.ys] as uPlot.AlignedData, true);
  }, [data, structure]);

  useEffect(() => {
    const made = plot.current;
    const key = rangeKey(xRange, data);
    if (!made || given.current.range === key) return;
    given.current.range = key;
    if (xRange) made.setScale("x", { min: xRange[0], max: xRange[1] });
    else if (data.x.length) made.setScale("x", { min: data.x[0], max: data.x[data.x.length - 1] });
    // `data` changes are handled by setData above, which re-ranges through the range function.
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [xRange?.[0], xRange?.[1]]);

  useEffect(() => {
    const made = plot.current;
    if (!made || (given.current.marks === marks && given.current.ceiling === yCeiling)) return;
    given.current.marks = marks;
    given.current.ceiling = yCeiling;
    made.redraw(true, false);
  }, [marks, yCeiling]);

  const points = pointsIn(data, lines.length);
  const lastX = data.x.length ? data.x[data.x.length - 1] : null;
  return (
    <figure className="metric-chart card" aria-label={`${title} chart`} data-points={points} data-last-x={lastX ?? ""}>
      <figcaption className="metric-chart-head">
        <span className="metric-chart-title">{title}</span>
        <Legend lines={lines} data={data} cursor={cursor} unit={unit} xKind={xKind} />
      </figcaption>
      {drawable ? (
        <div ref={holder} className="metric-chart-plot" />
      ) : (
        <p className="muted small">This browser cannot draw charts (no canvas): the values above are the newest.</p>
      )}
      {children}
    </figure>
  );
}

function Legend({ lines, data, cursor, unit, xKind }: { lines: ChartLine[]; data: Aligned; cursor: number | null; unit: string; xKind: XKind }) {
  const at = cursor !== null && cursor < data.x.length ? cursor : null;
  return (
    <span className="metric-legend">
      {at !== null ? <span className="metric-legend-x muted">{formatX(xKind, data.x[at])}</span> : null}
      {lines.map((line, i) => {
        const column = data.ys[i] ?? [];
        const index = at ?? latestIndex(column);
        const value = index === null ? null : column[index];
        return (
          <span key={`${line.label}-${i}`} className="metric-legend-item" data-line={line.label}>
            <span className="metric-swatch" data-color={line.color} ref={(el) => paintSwatch(el, line)} aria-hidden="true" />
            <span className="metric-legend-label">{line.label}</span>
            <span className="metric-legend-value">{formatValue(value, unit)}</span>
          </span>
        );
      })}
    </span>
  );
}

/** A swatch takes its line's colour through the CSSOM (the policy refuses style attributes written by markup only). */
function paintSwatch(element: HTMLSpanElement | null, line: ChartLine): void {
  if (!element) return;
  element.style.backgroundColor = line.color;
  element.style.borderStyle = line.dash ? "dashed" : "solid";
}

/** Attempt boundaries on the canvas: red for an interruption (a band for the time away), grey otherwise. */
function drawMarks(u: uPlot, marks: Mark[]): void {
  if (!marks.length) return;
  const ctx = u.ctx;
  const ratio = uPlot.pxRatio;
  const { left, top, width, height } = u.bbox;
  const xMin = u.scales.x.min ?? -Infinity;
  const xMax = u.scales.x.max ?? Infinity;
  const labels: { x: number; text: string; color: string }[] = [];
  ctx.save();
  ctx.beginPath();
  ctx.rect(left, top, width, height);
  ctx.clip();
  for (const mark of marks) {
    const end = mark.until ?? mark.x;
    if (end < xMin || mark.x > xMax) continue;
    const color = mark.interrupted ? RED : GREY;
    const x0 = u.valToPos(mark.x, "x", true);
    if (mark.until !== undefined) {
      const x1 = u.valToPos(mark.until, "x", true);
      ctx.fillStyle = "rgba(198, 40, 40, 0.10)";
      ctx.fillRect(x0, top, Math.max(ratio * 2, x1 - x0), height);
    }
    const lineX = mark.until !== undefined ? u.valToPos(mark.until, "x", true) : x0;
    ctx.strokeStyle = color;
    ctx.lineWidth = ratio;
    ctx.setLineDash([4 * ratio, 3 * ratio]);
    ctx.beginPath();
    ctx.moveTo(lineX, top);
    ctx.lineTo(lineX, top + height);
    ctx.stroke();
    ctx.setLineDash([]);
    if (mark.cut) {
      const cx = u.valToPos(mark.cut.x, "x", true);
      const cy = u.valToPos(mark.cut.y, "y", true);
      const r = 4 * ratio;
      ctx.strokeStyle = RED;
      ctx.lineWidth = 2 * ratio;
      ctx.beginPath();
      ctx.moveTo(cx - r, cy - r);
      ctx.lineTo(cx + r, cy + r);
      ctx.moveTo(cx + r, cy - r);
      ctx.lineTo(cx - r, cy + r);
      ctx.stroke();
    }
    labels.push({ x: lineX, text: mark.label, color });
  }
  ctx.restore();
  // Labels in the room above the plot, after their line (before it near the right edge); a later one never overlaps an earlier one.
  ctx.save();
  ctx.font = `${11 * ratio}px system-ui, sans-serif`;
  ctx.textAlign = "left";
  ctx.textBaseline = "alphabetic";
  let freeFrom = -Infinity;
  for (const label of labels) {
    const textWidth = ctx.measureText(label.text).width;
    let textX = label.x + 4 * ratio;
    if (textX + textWidth > left + width) textX = label.x - textWidth - 4 * ratio;
    if (textX < freeFrom) continue;
    ctx.fillStyle = label.color;
    ctx.fillText(label.text, Math.max(0, textX), top - 6 * ratio);
    freeFrom = textX + textWidth + 8 * ratio;
  }
  ctx.restore();
}
