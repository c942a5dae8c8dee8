// The run page's terminals: shells in a running job through the relay
// (docs/ACCESS.md, "Terminal in the browser"). Each terminal is its own
// session (grant, socket, shell); several can be open at once, one shown.
import { FitAddon } from "@xterm/addon-fit";
import { Unicode11Addon } from "@xterm/addon-unicode11";
import { WebLinksAddon } from "@xterm/addon-web-links";
import { Terminal, type ITheme } from "@xterm/xterm";
import "@xterm/xterm/css/xterm.css";
import { useContext, useEffect, useRef, useState } from "react";
import { errorMessage } from "../api/client";
import { endSession, grantTerminal, RelayConnection, RelaySocketFactoryContext, type RelayPhase } from "../api/relay";
import type { Job, Run } from "../api/types";
import { adoptInlineStyles } from "../lib/cspStyles";
import { storedTerminals, storeTerminals } from "../lib/terminalStore";
import { useWorkspace } from "../workspace";

export type TerminalPhase = RelayPhase | { phase: "granting" };

interface OpenTerminal {
  key: number;
  job: string;
  label: string;
  /** Its session, once granted and until it ends: what a reload reattaches to. */
  session?: string;
}

// The log viewer's colours (styles.css: --log-bg, --log-text); xterm raises
// any colour a program picks to this contrast against its background.
const THEME: ITheme = { background: "#0d1117", foreground: "#e6edf3", cursor: "#e6edf3", selectionBackground: "#3b5070" };
const MINIMUM_CONTRAST = 4.5;
const SCROLLBACK_LINES = 5_000;
// A Mac's Cmd+C and Cmd+V are the browser's copy and paste; elsewhere Ctrl+C is the shell's interrupt.
const ON_A_MAC = typeof navigator !== "undefined" && /Mac|iPhone|iPad/.test(navigator.userAgent);
const COPY_PASTE_HINT = ON_A_MAC ? "Copy: select, then ⌘C · Paste: ⌘V" : "Copy: select, then Ctrl+Shift+C · Paste: Ctrl+Shift+V";
// Tab and Esc are the shell's (completion, and the start of Alt-key sequences): Ctrl+F6, which
// no shell or full-screen program takes, moves the keyboard out of the terminal to its toolbar.
const KEYS_HINT = `${COPY_PASTE_HINT} · Leave: Ctrl+F6`;
// A reload's new terminal starts blank: the shell is the one it had, its screen is not kept.
const REATTACHED = "\x1b[2m(reattached after a reload: the same shell; what it showed before is not kept)\x1b[0m\r\n";

/** Why `job` can take no terminal now, or null when it can. */
export function terminalUnavailable(job: Job | null, canWrite: boolean): string | null {
  if (!canWrite) return "Viewers cannot open a terminal: a member or an admin of this workspace can.";
  if (!job) return "This run has no jobs.";
  if (job.cached_from) return `Job ${job.name} was reused from ${job.cached_from.run} (cached): it does not run, so there is no shell to open.`;
  switch (job.status) {
    case "running":
      return null;
    case "pending":
      return `Job ${job.name} is pending: a terminal opens once it runs.`;
    case "assigned":
      return `Job ${job.name} is starting on its machine: a terminal opens once it runs.`;
    case "stopping":
      return `Job ${job.name} is stopping: a terminal opens only into a running job.`;
    default:
      return `Job ${job.name} has ${job.status}: a terminal opens only into a running job.`;
  }
}

/**
 * The Terminal tab's content: a tab per open terminal, "+" to open another in
 * `job` (the selected job). The first is opened when the tab is first shown,
 * unless the page reattaches to terminals it had before a reload.
 */
export function TerminalPanel({ run, job, shown }: { run: Run; job: Job | null; shown: boolean }) {
  const { slug, canWrite } = useWorkspace();
  const [terminals, setTerminals] = useState<OpenTerminal[]>(() => storedTerminals(slug, run.name));
  const [current, setCurrent] = useState<number | null>(() => terminals[terminals.length - 1]?.key ?? null);
  const [phases, setPhases] = useState<Record<number, TerminalPhase>>({});
  const counter = useRef(Math.max(0, ...terminals.map((t) => t.key)));
  const openedFirst = useRef(terminals.length > 0);
  const unavailable = terminalUnavailable(job, canWrite);

  useEffect(() => {
    const live = terminals.flatMap((t) => (t.session ? [{ ...t, session: t.session }] : []));
    storeTerminals(slug, run.name, live);
  }, [slug, run.name, terminals]);
  const update = (key: number, change: Partial<OpenTerminal>) =>
    setTerminals((list) => list.map((t) => (t.key === key ? { ...t, ...change } : t)));

  const open = () => {
    if (!job || unavailable) return;
    counter.current += 1;
    const key = counter.current;
    setTerminals((list) => [...list, { key, job: job.name, label: `${job.name} ${key}` }]);
    setCurrent(key);
  };
  const close = (key: number) => {
    const rest = terminals.filter((t) => t.key !== key);
    setTerminals(rest);
    if (current === key) setCurrent(rest.length ? rest[rest.length - 1].key : null);
    return rest;
  };
  /** A reattached terminal whose session is no more leaves quietly; if it was the last, a new one opens. */
  const gone = (key: number) => {
    if (!close(key).length) openedFirst.current = false;
  };
  useEffect(() => {
    if (!shown || openedFirst.current || unavailable || terminals.length) return;
    openedFirst.current = true;
    open();
    // Only the first showing of a tab that can take one opens a terminal by itself.
    // eslint-disable-next-line react-hooks/exhaustive-deps
  }, [shown, unavailable, terminals.length]);

  return (
    <div className="terminals">
      <div className="terminal-bar">
        {terminals.length ? (
          <div role="tablist" aria-label="Terminals" className="terminal-tabs">
            {terminals.map((t) => (
              <TerminalTab key={t.key} terminal={t} phase={phases[t.key]} selected={t.key === current} onSelect={() => setCurrent(t.key)} />
            ))}
          </div>
        ) : null}
        {!unavailable && job ? (
          <button type="button" className="btn btn-small" onClick={open} aria-label={`New terminal in ${job.name}`} title={`New terminal in ${job.name}`}>
            +
          </button>
        ) : null}
      </div>
      {unavailable ? (
        <p className="muted terminal-why" role="status">
          {unavailable}
        </p>
      ) : null}
      {terminals.map((t) => (
        <TerminalView
          key={t.key}
          id={t.key}
          run={run.id}
          job={t.job}
          label={t.label}
          resume={t.session}
          shown={shown && t.key === current}
          onSession={(session) => update(t.key, { session })}
          onPhase={(phase) => {
            setPhases((all) => ({ ...all, [t.key]: phase }));
            if (phase.phase === "ended") update(t.key, { session: undefined });
          }}
          onGone={() => gone(t.key)}
          onClose={() => close(t.key)}
        />
      ))}
    </div>
  );
}

function TerminalTab({ terminal, phase, selected, onSelect }: { terminal: OpenTerminal; phase?: TerminalPhase; selected: boolean; onSelect: () => void }) {
  const note = phase?.phase === "reconnecting" ? " (reconnecting…)" : phase?.phase === "ended" ? " (ended)" : "";
  return (
    <button
      type="button"
      role="tab"
      id={`terminal-tab-${terminal.key}`}
      aria-selected={selected}
      aria-controls={`terminal-${terminal.key}`}
      tabIndex={selected ? 0 : -1}
      className={`tab ${selected ? "tab-selected" : ""}`}
      onClick={onSelect}
    >
      {terminal.label}
      {note}
    </button>
  );
}

interface ViewProps {
  id: number;
  run: string;
  job: string;
  label: string;
  /** A session to reattach to (after a reload) instead of asking for a grant. */
  resume?: string;
  shown: boolean;
  onSession: (session: string) => void;
  onPhase: (phase: TerminalPhase) => void;
  /** A reattached session that is no more (its grace passed, or another tab has it). */
  onGone: () => void;
  onClose: () => void;
}

/** One terminal: xterm on a session of its own, from its grant (or a reload's reattach) until it is closed. */
function TerminalView({ id, run, job, label, resume, shown, onSession, onPhase, onGone, onClose }: ViewProps) {
  const { slug } = useWorkspace();
  const factory = useContext(RelaySocketFactoryContext);
  const host = useRef<HTMLDivElement>(null);
  const terminal = useRef<{ term: Terminal; fit: () => void } | null>(null);
  const [phase, setPhase] = useState<TerminalPhase>({ phase: "granting" });
  const handlers = useRef({ onSession, onPhase, onGone });
  handlers.current = { onSession, onPhase, onGone };
  const resumed = useRef(resume);
  const live = useRef<string | null>(null); // the session, until it ends
  const closeButton = useRef<HTMLButtonElement>(null);

  useEffect(() => {
    const element = host.current as HTMLDivElement;
    const { term, fit, dispose } = createTerminal(element, () => closeButton.current?.focus());
    terminal.current = { term, fit };
    let connection: RelayConnection | null = null;
    let cancelled = false;
    let opened = false;
    const report = (next: TerminalPhase) => {
      if (next.phase === "ended" && resumed.current && !opened) {
        handlers.current.onGone();
        return;
      }
      if (next.phase === "open" && !opened && resumed.current) term.write(REATTACHED);
      opened ||= next.phase === "open";
      if (next.phase === "ended") live.current = null;
      setPhase(next);
      handlers.current.onPhase(next);
      term.options.disableStdin = next.phase !== "open";
      if (next.phase === "ended") term.write(`\r\n\x1b[1;33msession ended: ${next.reason}\x1b[0m\r\n`);
    };
    const attach = (session: string) => {
      live.current = session;
      connection = new RelayConnection(session, { onBytes: (bytes) => term.write(bytes), onPhase: report }, factory);
      connection.resize(term.cols, term.rows);
      connection.start();
    };
    term.onData((data) => connection?.sendText(data));
    term.onBinary((data) => connection?.sendBinary(data));
    term.onResize(({ cols, rows }) => connection?.resize(cols, rows));
    if (resumed.current) {
      attach(resumed.current);
    } else {
      report({ phase: "granting" });
      grantTerminal(slug, run, job).then(
        (grant) => {
          if (cancelled) {
            void endSession(slug, grant.id).catch(() => undefined); // asked for by a terminal already gone
            return;
          }
          handlers.current.onSession(grant.id);
          attach(grant.id);
        },
        (caught: unknown) => {
          if (!cancelled) report({ phase: "ended", reason: errorMessage(caught) });
        },
      );
    }
    return () => {
      // The page goes (a reload, another page): the session waits for the grace, for a reload to reattach.
      cancelled = true;
      connection?.close();
      terminal.current = null;
      dispose();
    };
  }, [slug, run, job, factory]);

  /** The person closes it: its session (and shell) ends now, audited as ended by its user. */
  const close = () => {
    if (live.current) void endSession(slug, live.current).catch(() => undefined);
    onClose();
  };

  useEffect(() => {
    if (!shown || !terminal.current) return;
    terminal.current.fit();
    terminal.current.term.focus();
  }, [shown]);

  return (
    <section
      className="terminal-session"
      id={`terminal-${id}`}
      role="tabpanel"
      aria-labelledby={`terminal-tab-${id}`}
      hidden={!shown}
      data-phase={phase.phase}
    >
      <div className="terminal-toolbar">
        <span className="terminal-state" role="status">
          {describePhase(phase)}
        </span>
        <span className="toolbar-spacer" />
        <span className="terminal-hint">{KEYS_HINT}</span>
        <button type="button" className="btn btn-small" onClick={close} aria-label={`Close terminal ${label}`} ref={closeButton}>
          Close
        </button>
      </div>
      <div className="terminal-screen" ref={host} />
    </section>
  );
}

export function describePhase(phase: TerminalPhase): string {
  switch (phase.phase) {
    case "granting":
      return "Opening a session…";
    case "connecting":
      return "Connecting…";
    case "open":
      return "Connected";
    case "reconnecting":
      return "Connection lost: reconnecting… (the shell keeps running)";
    case "ended":
      return `Session ended: ${phase.reason}`;
  }
}

/**
 * xterm in `element`, fitted to it as it resizes, with copy/paste keys and
 * Ctrl+F6 calling `leave`; `dispose` undoes it all.
 */
function createTerminal(element: HTMLElement, leave: () => void): { term: Terminal; fit: () => void; dispose: () => void } {
  const term = new Terminal({
    allowProposedApi: true, // the Unicode 11 widths
    cursorBlink: true,
    fontFamily: 'ui-monospace, SFMono-Regular, "SF Mono", Menlo, Consolas, "Liberation Mono", "DejaVu Sans Mono", monospace',
    fontSize: 13,
    minimumContrastRatio: MINIMUM_CONTRAST,
    scrollback: SCROLLBACK_LINES,
    theme: THEME,
  });
  const fitAddon = new FitAddon();
  term.loadAddon(fitAddon);
  term.loadAddon(new Unicode11Addon());
  term.unicode.activeVersion = "11";
  term.loadAddon(new WebLinksAddon());
  term.attachCustomKeyEventHandler((event) => {
    if (event.key === "F6" && event.ctrlKey && !event.shiftKey && !event.altKey && !event.metaKey) {
      event.preventDefault();
      if (event.type === "keydown") leave();
      return false;
    }
    return copyPasteKeys(term, event);
  });
  term.open(element);
  const restoreStyles = adoptInlineStyles(element);
  // A hidden terminal has no size: it is fitted when it is shown.
  const fit = () => {
    if (element.clientWidth > 0 && element.clientHeight > 0) fitAddon.fit();
  };
  const observer = typeof ResizeObserver === "undefined" ? null : new ResizeObserver(fit);
  observer?.observe(element);
  fit();
  return {
    term,
    fit,
    dispose: () => {
      observer?.disconnect();
      term.dispose();
      restoreStyles();
    },
  };
}

/**
 * Ctrl+Shift+C copies the selection (Ctrl+C stays the shell's interrupt);
 * Ctrl+Shift+V is left to the browser, whose paste event xterm reads. On a
 * Mac, Cmd+C and Cmd+V are the browser's copy and paste, which xterm handles.
 */
function copyPasteKeys(term: Terminal, event: KeyboardEvent): boolean {
  if (event.type !== "keydown" || !event.ctrlKey || !event.shiftKey) return true;
  if (event.code === "KeyC") {
    event.preventDefault(); // Chromium's Ctrl+Shift+C opens the element inspector
    if (term.hasSelection()) void navigator.clipboard?.writeText(term.getSelection()).catch(() => undefined);
    return false;
  }
  return event.code !== "KeyV";
}
