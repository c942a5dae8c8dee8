// A terminal session into a running job (docs/ACCESS.md): a grant from the
// REST API, then the client end of the relay, /ws/v1/relay/<session>/, which
// the session cookie authenticates. Binary frames are the shell's bytes both
// ways; text frames are JSON control messages. A dropped socket reconnects to
// the same session while the server keeps its shell (the terminal grace).
import { createContext } from "react";
import { post, wsPath } from "./client";
import { liveUrl, type SocketLike } from "./live";

/** POST …/runs/<run>/sessions/ → 201. */
export interface Grant {
  id: string;
  url: string;
  expires_at: string;
  run: string;
  job: string;
  attempt: number;
  kind: "ssh" | "terminal" | "port";
}

export function grantTerminal(workspace: string, run: string, job: string): Promise<Grant> {
  return post<Grant>(wsPath(workspace, `runs/${encodeURIComponent(run)}/sessions/`), { job, kind: "terminal", client: "browser terminal" });
}

/** POST …/sessions/<id>/end/: the session ends now (its shell too), audited as ended by its user. */
export function endSession(workspace: string, session: string): Promise<unknown> {
  return post(wsPath(workspace, `sessions/${encodeURIComponent(session)}/end/`));
}

/** The part of the browser WebSocket a relay connection uses. */
export interface RelaySocket extends SocketLike {
  binaryType: BinaryType;
  readonly readyState: number;
  send(data: string | ArrayBufferView<ArrayBuffer>): void;
}

export type RelaySocketFactory = (url: string) => RelaySocket;

export const browserRelaySocketFactory: RelaySocketFactory = (url) => new WebSocket(url);

export const RelaySocketFactoryContext = createContext<RelaySocketFactory>(browserRelaySocketFactory);

const OPEN = 1; // WebSocket.OPEN
// The server keeps a terminal's shell this long after its socket drops
// (TRAINYARD_TERMINAL_GRACE's default); past it, reconnecting cannot help.
export const RECONNECT_WINDOW_MS = 30_000;
const RECONNECT_DELAYS_MS = [250, 500, 1_000, 2_000, 3_000];
// Binary frames are at most 256 KiB on the wire; a paste is sent in pieces well below that.
export const MAX_FRAME_BYTES = 64 * 1024;

/** Close codes the client end uses (CONTRACT: "Close codes"), as a reader would say them. */
export const CLOSE_REASONS: Record<number, string> = {
  1000: "the session was closed",
  1008: "the server refused this page's connection",
  4401: "you are not signed in: sign in again and open a new terminal",
  4403: "you may not open a terminal in this job",
  4404: "the session is gone (it ended, or was not used in time): open a new terminal",
  4408: "it was idle for too long",
  4409: "the job's attempt ended",
  4410: "an admin ended it",
  4429: "too many sessions are open: close one and try again",
};

export type RelayPhase =
  | { phase: "connecting" }
  | { phase: "open" }
  | { phase: "reconnecting"; attempt: number }
  | { phase: "ended"; reason: string };

export interface RelayHandlers {
  /** Bytes from the shell. */
  onBytes(bytes: Uint8Array): void;
  onPhase(phase: RelayPhase): void;
}

/**
 * One terminal session's client end. `start()` connects; a socket that drops
 * without the server saying why (no end message, no 4xxx/1000 close) is
 * reconnected to the same session, with backoff, for RECONNECT_WINDOW_MS.
 */
export class RelayConnection {
  private socket: RelaySocket | null = null;
  private size: { cols: number; rows: number } | null = null;
  private endReason: string | null = null;
  private droppedAt: number | null = null;
  private attempt = 0;
  private retry: ReturnType<typeof setTimeout> | undefined;
  private stopped = false;
  private readonly encoder = new TextEncoder();

  constructor(
    private readonly sessionId: string,
    private readonly handlers: RelayHandlers,
    private readonly factory: RelaySocketFactory = browserRelaySocketFactory,
    private readonly now: () => number = Date.now,
  ) {}

  get path(): string {
    return `/ws/v1/relay/${encodeURIComponent(this.sessionId)}/`;
  }

  start(): void {
    this.handlers.onPhase({ phase: "connecting" });
    this.connect();
  }

  /** Keystrokes and pastes (UTF-8). */
  sendText(text: string): void {
    this.sendBytes(this.encoder.encode(text));
  }

  /** xterm's binary reports (mouse): one byte per character. */
  sendBinary(data: string): void {
    this.sendBytes(Uint8Array.from(data, (c) => c.charCodeAt(0) & 0xff));
  }

  resize(cols: number, rows: number): void {
    this.size = { cols, rows };
    this.sendResize();
  }

  /** The user closed the terminal: the session ends. */
  close(): void {
    this.stopped = true;
    clearTimeout(this.retry);
    this.socket?.close(1000);
    this.socket = null;
  }

  private connect(): void {
    if (this.stopped) return;
    const socket = this.factory(liveUrl(this.path));
    socket.binaryType = "arraybuffer";
    this.socket = socket;
    socket.onopen = () => {
      this.droppedAt = null;
      this.attempt = 0;
      this.sendResize();
      this.handlers.onPhase({ phase: "open" });
    };
    socket.onmessage = (event) => this.receive(event.data);
    socket.onclose = (event) => this.closed(socket, event.code, event.reason);
  }

  private receive(data: unknown): void {
    if (data instanceof ArrayBuffer) {
      this.handlers.onBytes(new Uint8Array(data));
      return;
    }
    if (typeof data !== "string") return;
    const message = parseControl(data);
    if (message?.type === "ready") this.sendResize();
    if (message?.type === "end") this.endReason = message.reason || CLOSE_REASONS[1000];
  }

  private closed(socket: RelaySocket, code: number, reason: string): void {
    if (this.stopped || socket !== this.socket) return;
    this.socket = null;
    if (this.endReason !== null || this.isFinal(code)) {
      this.end(this.endReason ?? (reason || CLOSE_REASONS[code] || `the connection closed (code ${code})`));
      return;
    }
    this.droppedAt ??= this.now();
    if (this.now() - this.droppedAt >= RECONNECT_WINDOW_MS) {
      this.end(`the connection dropped and did not come back within ${RECONNECT_WINDOW_MS / 1000} s`);
      return;
    }
    this.attempt += 1;
    this.handlers.onPhase({ phase: "reconnecting", attempt: this.attempt });
    const delay = RECONNECT_DELAYS_MS[Math.min(this.attempt, RECONNECT_DELAYS_MS.length) - 1];
    this.retry = setTimeout(() => this.connect(), delay);
  }

  /**
   * Whether a close without an end message rules out reconnecting. A 4403
   * while reconnecting is retried: the server may not yet have seen the
   * dropped socket go, and refuses a second client until it has.
   */
  private isFinal(code: number): boolean {
    if (code === 4403 && this.droppedAt !== null) return false;
    return code === 1000 || code === 1008 || (code >= 4000 && code < 5000);
  }

  private end(reason: string): void {
    this.stopped = true;
    this.handlers.onPhase({ phase: "ended", reason });
  }

  private sendBytes(bytes: Uint8Array<ArrayBuffer>): void {
    const socket = this.socket;
    if (!socket || socket.readyState !== OPEN) return;
    for (let start = 0; start < bytes.length; start += MAX_FRAME_BYTES) {
      socket.send(bytes.subarray(start, start + MAX_FRAME_BYTES));
    }
  }

  private sendResize(): void {
    const socket = this.socket;
    if (!socket || socket.readyState !== OPEN || !this.size) return;
    socket.send(JSON.stringify({ type: "resize", ...this.size }));
  }
}

type Control = { type: "ready" } | { type: "end"; reason: string };

function parseControl(data: string): Control | null {
  try {
    const message = JSON.parse(data) as { type?: unknown; reason?: unknown };
    if (message.type === "ready") return { type: "ready" };
    if (message.type === "end") return { type: "end", reason: typeof message.reason === "string" ? message.reason : "" };
  } catch {
    return null;
  }
  return null;
}
