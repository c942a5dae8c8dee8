// The run's job DAG: one column per level (a job sits one column right of the
// last job it needs), edges drawn as curves. Fixed node sizes, no measuring.
import type { Job } from "../api/types";
import { elapsedSeconds, humanDuration } from "../lib/format";

const NODE_W = 190;
const NODE_H = 52;
const COL_GAP = 56;
const ROW_GAP = 12;

interface Placed {
  job: Job;
  level: number;
  row: number;
}

export function layoutJobs(jobs: Job[]): Placed[] {
  const byName = new Map(jobs.map((job) => [job.name, job]));
  const levels = new Map<string, number>();
  const levelOf = (job: Job, seen: Set<string>): number => {
    const known = levels.get(job.name);
    if (known !== undefined) return known;
    if (seen.has(job.name)) return 0; // a cycle cannot be submitted; stay safe anyway
    seen.add(job.name);
    const parents = dependencies(job).map((name) => byName.get(name)).filter((j): j is Job => Boolean(j));
    const level = parents.length ? 1 + Math.max(...parents.map((p) => levelOf(p, seen))) : 0;
    levels.set(job.name, level);
    return level;
  };
  const rows = new Map<number, number>();
  return jobs.map((job) => {
    const level = levelOf(job, new Set());
    const row = rows.get(level) ?? 0;
    rows.set(level, row + 1);
    return { job, level, row };
  });
}

export function JobGraph({
  jobs,
  selected,
  onSelect,
  now,
}: {
  jobs: Job[];
  selected: string | null;
  onSelect: (job: Job) => void;
  now: number;
}) {
  const placed = layoutJobs(jobs);
  const position = new Map(placed.map((p) => [p.job.name, p]));
  const columns = Math.max(1, ...placed.map((p) => p.level + 1));
  const rows = Math.max(1, ...placed.map((p) => p.row + 1));
  const width = columns * NODE_W + (columns - 1) * COL_GAP;
  const height = rows * NODE_H + (rows - 1) * ROW_GAP;
  const x = (p: Placed) => p.level * (NODE_W + COL_GAP);
  const y = (p: Placed) => p.row * (NODE_H + ROW_GAP);

  const edges = placed.flatMap((p) =>
    dependencies(p.job)
      .map((name) => position.get(name))
      .filter((from): from is Placed => Boolean(from))
      .map((from) => ({ from, to: p, soft: (p.job.after_running ?? []).includes(from.job.name) })),
  );

  return (
    <div className="dag-wrap">
      <div className="dag" style={{ width, height }} role="group" aria-label="Jobs">
        <svg className="dag-edges" width={width} height={height} aria-hidden="true">
          <defs>
            <marker id="arrow" viewBox="0 0 8 8" refX="7" refY="4" markerWidth="8" markerHeight="8" orient="auto">
              <path d="M0,0 L8,4 L0,8 z" className="dag-arrow" />
            </marker>
          </defs>
          {edges.map(({ from, to, soft }) => {
            const x1 = x(from) + NODE_W;
            const y1 = y(from) + NODE_H / 2;
            const x2 = x(to) - 2;
            const y2 = y(to) + NODE_H / 2;
            const mid = (x1 + x2) / 2;
            return (
              <path
                key={`${from.job.name}->${to.job.name}`}
                d={`M${x1},${y1} C${mid},${y1} ${mid},${y2} ${x2},${y2}`}
                className={soft ? "dag-edge dag-edge-soft" : "dag-edge"}
                markerEnd="url(#arrow)"
              />
            );
          })}
        </svg>
        {placed.map((p) => {
          const job = p.job;
          const needs = dependencies(job);
          return (
            <button
              key={job.id}
              type="button"
              className={`dag-node status-${job.status} ${selected === job.name ? "selected" : ""}`}
              style={{ left: x(p), top: y(p), width: NODE_W, height: NODE_H }}
              aria-pressed={selected === job.name}
              aria-label={`Job ${job.name}: ${job.status}${needs.length ? `, needs ${needs.join(", ")}` : ""}`}
              onClick={() => onSelect(job)}
              data-job={job.name}
            >
              <span className="dag-title">
                <span className={`dot dot-${job.status}`} aria-hidden="true" />
                {job.name}
              </span>
              <span className="dag-meta">
                {job.cached_from ? "reused" : job.status}
                {job.started_at ? ` · ${humanDuration(elapsedSeconds(job.started_at, job.finished_at, now))}` : ""}
              </span>
            </button>
          );
        })}
      </div>
    </div>
  );
}

function dependencies(job: Job): string[] {
  return [...new Set([...(job.needs ?? []), ...(job.after_running ?? [])])];
}
