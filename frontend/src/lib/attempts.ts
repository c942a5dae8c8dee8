// A job's attempts as the run page shows them: marks in its one log (the
// lines of attempt N are seqs first_seq..last_seq, docs/decisions/0070) and
// words for why each attempt ended.
import type { Attempt, Job, TerminationReason } from "../api/types";
import type { AttemptMark, ViewerLine } from "../components/LogViewer";

/** Short words for a reason, as in "Attempt 1 ended: instance lost". */
const REASON_LABELS: Record<TerminationReason, string> = {
  done: "done",
  error: "failed",
  stopped_by_user: "stopped by user",
  no_capacity: "no capacity",
  interrupted: "interrupted",
  instance_lost: "instance lost",
  image_pull: "image pull failed",
  lease_expired: "lease expired",
  rejected: "rejected by the runner",
  unreachable: "runner unreachable",
  max_duration: "max duration reached",
  group_restart: "restarted with its group",
  low_gpu_utilization: "GPUs idle",
  stalled: "stalled",
  budget_exceeded: "stopped by the budget",
};

/** The longer explanation (backend/runs/reasons.py), for a tooltip. */
const REASON_DESCRIPTIONS: Record<TerminationReason, string> = {
  done: "the commands succeeded",
  error: "the job's commands failed",
  stopped_by_user: "stopped by a user",
  no_capacity: "no offer had capacity",
  interrupted: "the machine was interrupted (e.g. a spot reclaim)",
  instance_lost: "the machine was lost",
  image_pull: "the machine's image could not be pulled (the backend's image): it would never start",
  lease_expired: "the runner did not accept the job in time",
  rejected: "the runner refused the job",
  unreachable: "the runner was unreachable for too long",
  max_duration: "the job ran longer than its workflow's max_duration",
  group_restart: "another job of its group (a master or a worker) was interrupted: the whole group resumes together",
  low_gpu_utilization: "every GPU stayed below the workflow's utilization_policy threshold for its whole time_window",
  stalled: "no new log line and no new metric value for the workflow's stall timeout",
  budget_exceeded:
    "a budget that applies (the workspace's, the submitter's or the run's max_cost) was reached: stopped with its checkpoint synced, resumed when the budget allows",
};

/** Endings that need no mark when they end a job's only attempt. */
const NORMAL_ENDINGS: ReadonlyArray<Attempt["reason"]> = ["done", "error", "stopped_by_user", ""];

export function reasonLabel(reason: string): string {
  return REASON_LABELS[reason as TerminationReason] ?? reason.replace(/_/g, " ");
}

export function reasonDescription(reason: string): string {
  return REASON_DESCRIPTIONS[reason as TerminationReason] ?? "";
}

/** "10:04:11" in the viewer's time zone (24-hour, whatever the locale: it sits in log lines). */
export function clockTime(iso: string): string {
  const date = new Date(iso);
  return [date.getHours(), date.getMinutes(), date.getSeconds()].map((n) => String(n).padStart(2, "0")).join(":");
}

/**
 * Whether the log shows attempt marks: only when the job had more than one
 * attempt or its only one ended abnormally, so an ordinary run's log reads as
 * it always did (like `trainyard logs`).
 */
export function showsAttemptMarks(attempts: readonly Attempt[]): boolean {
  if (attempts.length > 1) return true;
  return attempts.length === 1 && attempts[0].status === "ended" && !NORMAL_ENDINGS.includes(attempts[0].reason);
}

/**
 * The log viewer's marks for a job:
 * 1. a start mark before the first line whose seq ≥ the attempt's first_seq
 *    (an attempt with no lines gets its mark where its lines would have been);
 * 2. an end mark after its last line (seq ≤ last_seq) for an ended attempt
 *    that is not the last one or did not end `done`.
 * `lines` are the job's lines in seq order (possibly only some of them), or
 * the length in seqs of a log the viewer places by seq (line seq s at index s - 1).
 */
export function attemptMarks(job: Pick<Job, "attempts">, lines: readonly ViewerLine[] | number): AttemptMark[] {
  const attempts = [...job.attempts].sort((a, b) => a.number - b.number);
  if (!showsAttemptMarks(attempts)) return [];
  const marks: AttemptMark[] = [];
  attempts.forEach((attempt, i) => {
    const next = attempts[i + 1];
    marks.push({ attempt: attempt.number, kind: "start", lineIndex: firstIndexAtLeast(lines, attempt.first_seq), label: startLabel(attempt) });
    if (attempt.status !== "ended" || (!next && attempt.reason === "done")) return;
    const after = attempt.last_seq !== null ? attempt.last_seq + 1 : next ? next.first_seq : Number.POSITIVE_INFINITY;
    marks.push({ attempt: attempt.number, kind: "end", lineIndex: firstIndexAtLeast(lines, after), label: endLabel(attempt) });
  });
  return marks;
}

/** "Attempt 2 on local-1a2b3c4d — started 10:04:11". */
/** "g5.xlarge us-east-1b (spot)" for a cloud machine; "" for this host's and self-hosted runners. */
export function attemptWhere(attempt: Attempt): string {
  if (!attempt.instance_type || !attempt.backend || attempt.backend === "local" || attempt.backend === "self-hosted") return "";
  const place = attempt.zone || attempt.region || "?";
  return `${attempt.instance_type} ${place} (${attempt.spot ? "spot" : "on-demand"})`;
}

/** "Attempt 2 on aws-1a2b · resumed from checkpoint 4 · g5.xlarge us-east-1b (spot) — started 12:00:01". */
export function startLabel(attempt: Attempt): string {
  const resumed = attempt.restored_checkpoint ? ` · resumed from checkpoint ${attempt.restored_checkpoint}` : "";
  const machine = attemptWhere(attempt);
  const where = (attempt.instance ? ` on ${attempt.instance}` : "") + resumed + (machine ? ` · ${machine}` : "");
  let when: string;
  if (attempt.started_at) when = `started ${clockTime(attempt.started_at)}`;
  else if (attempt.status === "ended") when = "never started";
  else when = "waiting to start";
  return `Attempt ${attempt.number}${where} — ${when}`;
}

/** "Attempt 1 ended: instance lost — machine local-… is gone". */
export function endLabel(attempt: Attempt): string {
  const code = attempt.exit_code !== null ? ` (exit code ${attempt.exit_code})` : "";
  const message = attempt.message ? ` — ${attempt.message}` : "";
  return `Attempt ${attempt.number} ended: ${reasonLabel(attempt.reason) || attempt.status}${code}${message}`;
}

/** Index of the first line with seq ≥ `seq` (lines.length if none): lines are in seq order. */
function firstIndexAtLeast(lines: readonly ViewerLine[] | number, seq: number): number {
  if (typeof lines === "number") return Math.max(0, Math.min(seq - 1, lines));
  let low = 0;
  let high = lines.length;
  while (low < high) {
    const middle = (low + high) >> 1;
    if (lines[middle].seq < seq) low = middle + 1;
    else high = middle;
  }
  return low;
}
