import type { ViewerLine } from "../components/LogViewer";
import type { Stream } from "../api/types";

/**
 * Every job's log lines of one run, appended in place as websocket frames
 * arrive (copying a 200,000-line array per frame would be too slow).
 * `version` changes on every append; React reads it with useSyncExternalStore.
 */
export class RunLogStore {
  private readonly jobs = new Map<string, ViewerLine[]>();
  private readonly listeners = new Set<() => void>();
  version = 0;

  subscribe = (listener: () => void): (() => void) => {
    this.listeners.add(listener);
    return () => this.listeners.delete(listener);
  };

  getVersion = (): number => this.version;

  lines(job: string): ViewerLine[] {
    let lines = this.jobs.get(job);
    if (!lines) {
      lines = [];
      this.jobs.set(job, lines);
    }
    return lines;
  }

  lastSeq(job: string): number {
    const lines = this.jobs.get(job);
    return lines && lines.length ? lines[lines.length - 1].seq : 0;
  }

  /** Append lines, dropping any already held (a reconnect may resend them). */
  append(job: string, incoming: [number, number, Stream, string][]): void {
    const lines = this.lines(job);
    let last = this.lastSeq(job);
    let added = 0;
    for (const [seq, ts, stream, text] of incoming) {
      if (seq <= last) continue;
      lines.push({ seq, ts, stream, text });
      last = seq;
      added += 1;
    }
    if (!added) return;
    this.version += 1;
    this.listeners.forEach((listener) => listener());
  }
}
