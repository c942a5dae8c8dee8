// The terminal sessions a run page has open, kept in this browser tab's
// sessionStorage: after a reload the page reattaches to them while the server
// keeps their shells (the terminal grace). A new browser tab starts with none:
// a session has one client at a time.

export interface StoredTerminal {
  key: number;
  job: string;
  label: string;
  session: string;
}

const MAX_STORED = 32;

export function storedTerminals(workspace: string, run: string): StoredTerminal[] {
  try {
    const parsed: unknown = JSON.parse(sessionStorage.getItem(storageKey(workspace, run)) ?? "[]");
    return Array.isArray(parsed) ? parsed.filter(isStoredTerminal).slice(0, MAX_STORED) : [];
  } catch {
    return [];
  }
}

export function storeTerminals(workspace: string, run: string, terminals: StoredTerminal[]): void {
  try {
    if (terminals.length) sessionStorage.setItem(storageKey(workspace, run), JSON.stringify(terminals.slice(0, MAX_STORED)));
    else sessionStorage.removeItem(storageKey(workspace, run));
  } catch {
    // Storage full or refused: a reload then opens new terminals.
  }
}

export function hasStoredTerminals(workspace: string, run: string): boolean {
  return storedTerminals(workspace, run).length > 0;
}

function storageKey(workspace: string, run: string): string {
  return `trainyard:terminals:${workspace}:${run}`;
}

function isStoredTerminal(value: unknown): value is StoredTerminal {
  if (!value || typeof value !== "object") return false;
  const t = value as Record<string, unknown>;
  return Number.isInteger(t.key) && typeof t.job === "string" && typeof t.label === "string" && typeof t.session === "string";
}
