import { useEffect, useRef, useState, type ReactNode } from "react";
import { absoluteTime, relativeTime } from "../lib/format";
import { useNow } from "../lib/hooks";

export function StatusBadge({ status }: { status: string }) {
  return (
    <span className={`badge badge-${status}`} data-status={status}>
      <span className="badge-dot" aria-hidden="true" />
      {status}
    </span>
  );
}

export function Time({ iso }: { iso: string | null | undefined }) {
  const now = useNow(30_000);
  if (!iso) return <span className="muted">—</span>;
  return (
    <time dateTime={iso} title={absoluteTime(iso)}>
      {relativeTime(iso, now)}
    </time>
  );
}

export function ErrorBanner({ error }: { error: string | null | undefined }) {
  if (!error) return null;
  return (
    <div className="banner banner-error" role="alert">
      {error}
    </div>
  );
}

export function Notice({ children }: { children: ReactNode }) {
  return (
    <div className="banner banner-info" role="status">
      {children}
    </div>
  );
}

export function Loading({ label = "Loading…" }: { label?: string }) {
  return (
    <div className="loading" role="status" aria-live="polite">
      <span className="spinner" aria-hidden="true" /> {label}
    </div>
  );
}

export function PageHeader({ title, children }: { title: ReactNode; children?: ReactNode }) {
  return (
    <header className="page-header">
      <h1>{title}</h1>
      {children ? <div className="page-actions">{children}</div> : null}
    </header>
  );
}

/** Copies `value`; says so for two seconds. */
export function CopyButton({ value, label = "Copy" }: { value: string; label?: string }) {
  const [copied, setCopied] = useState(false);
  const timer = useRef<ReturnType<typeof setTimeout>>(undefined);
  useEffect(() => () => clearTimeout(timer.current), []);
  const copy = async () => {
    try {
      await navigator.clipboard.writeText(value);
    } catch {
      fallbackCopy(value);
    }
    setCopied(true);
    clearTimeout(timer.current);
    timer.current = setTimeout(() => setCopied(false), 2000);
  };
  return (
    <button type="button" className="btn btn-small" onClick={copy} aria-label={`${label}: ${value}`}>
      {copied ? "Copied" : label}
    </button>
  );
}

/**
 * A destructive action in two steps: the button turns into "Confirm" / "Cancel"
 * in place (no modal, works with the keyboard and in end-to-end tests).
 */
export function ConfirmButton({
  label,
  confirmLabel,
  onConfirm,
  disabled,
  className = "btn btn-small btn-danger",
}: {
  label: string;
  confirmLabel?: string;
  onConfirm: () => void | Promise<void>;
  disabled?: boolean;
  className?: string;
}) {
  const [asking, setAsking] = useState(false);
  const [busy, setBusy] = useState(false);
  const confirmRef = useRef<HTMLButtonElement>(null);
  useEffect(() => {
    if (asking) confirmRef.current?.focus();
  }, [asking]);
  if (!asking) {
    return (
      <button type="button" className={className} onClick={() => setAsking(true)} disabled={disabled}>
        {label}
      </button>
    );
  }
  const confirm = async () => {
    setBusy(true);
    try {
      await onConfirm();
    } finally {
      setBusy(false);
      setAsking(false);
    }
  };
  return (
    <span className="confirm" role="group" aria-label={label}>
      <button ref={confirmRef} type="button" className="btn btn-small btn-danger-solid" onClick={confirm} disabled={busy}>
        {confirmLabel ?? `Confirm ${label.toLowerCase()}`}
      </button>
      <button type="button" className="btn btn-small" onClick={() => setAsking(false)} disabled={busy}>
        Cancel
      </button>
    </span>
  );
}

export function EmptyState({ title, children }: { title: string; children?: ReactNode }) {
  return (
    <div className="empty">
      <h2>{title}</h2>
      {children}
    </div>
  );
}

function fallbackCopy(value: string): void {
  const area = document.createElement("textarea");
  area.value = value;
  document.body.appendChild(area);
  area.select();
  try {
    document.execCommand("copy");
  } finally {
    area.remove();
  }
}
