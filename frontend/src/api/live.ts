// Websocket plumbing: a replaceable socket factory (tests inject a fake one)
// and a hook that keeps one socket open, reconnecting with backoff.
import { createContext, useContext, useEffect, useRef } from "react";
import type { LiveFrame, LogsWire, Stream } from "./types";

/** The part of the browser WebSocket the app uses. */
export interface SocketLike {
  onopen: ((event: Event) => void) | null;
  onmessage: ((event: MessageEvent) => void) | null;
  onclose: ((event: CloseEvent) => void) | null;
  onerror: ((event: Event) => void) | null;
  close(code?: number): void;
}

export type SocketFactory = (url: string) => SocketLike;

export const browserSocketFactory: SocketFactory = (url) => new WebSocket(url);

export const SocketFactoryContext = createContext<SocketFactory>(browserSocketFactory);

/** ws(s)://<this host><path>: the session cookie authenticates it. */
export function liveUrl(path: string): string {
  const scheme = window.location.protocol === "https:" ? "wss:" : "ws:";
  return `${scheme}//${window.location.host}${path}`;
}

// Close codes after which reconnecting cannot help: done, no credentials, no access.
const FINAL_CLOSE_CODES = new Set([1000, 4401, 4403, 4404]);

/**
 * Keep a socket to `path` open (none when `path` is null) and call `onFrame`
 * for each frame. `query` is evaluated at every (re)connect so that callers can
 * resume where they stopped (`?after_seq=`).
 */
export function useLiveFrames(
  path: string | null,
  onFrame: (frame: LiveFrame) => void,
  query?: () => string,
): void {
  const factory = useContext(SocketFactoryContext);
  const onFrameRef = useRef(onFrame);
  onFrameRef.current = onFrame;
  const queryRef = useRef(query);
  queryRef.current = query;

  useEffect(() => {
    if (!path) return undefined;
    let socket: SocketLike | null = null;
    let retry: ReturnType<typeof setTimeout> | undefined;
    let attempts = 0;
    let stopped = false;

    const connect = () => {
      if (stopped) return;
      socket = factory(liveUrl(path + (queryRef.current?.() ?? "")));
      socket.onopen = () => {
        attempts = 0;
      };
      socket.onmessage = (event) => {
        const frame = parseFrame(event.data);
        if (frame) onFrameRef.current(frame);
      };
      socket.onclose = (event) => {
        if (stopped || FINAL_CLOSE_CODES.has(event.code)) return;
        attempts += 1;
        retry = setTimeout(connect, Math.min(30_000, 500 * 2 ** Math.min(attempts, 6)));
      };
    };
    connect();
    return () => {
      stopped = true;
      clearTimeout(retry);
      socket?.close(1000);
    };
  }, [path, factory]);
}

function parseFrame(data: unknown): LiveFrame | null {
  if (typeof data !== "string") return null;
  try {
    const frame = JSON.parse(data) as Extract<LiveFrame, { type: "run" }> | LogsWire;
    if (frame.type === "run") return frame;
    if (frame.type === "logs") return { type: "logs", job: frame.job, lines: unpack(frame) };
  } catch {
    return null;
  }
  return null;
}

/** [seq, ts, stream, text] of every line of a chunk frame. */
export function unpack(frame: LogsWire): [number, number, Stream, string][] {
  const texts = frame.text.split("\n");
  const lines: [number, number, Stream, string][] = [];
  let i = 0;
  for (const [count, ts] of frame.times) {
    for (let k = 0; k < count && i < frame.streams.length; k += 1, i += 1) {
      lines.push([frame.first_seq + i, ts, frame.streams[i] as Stream, texts[i]]);
    }
  }
  return lines;
}
