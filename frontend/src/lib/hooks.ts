import { useCallback, useEffect, useRef, useState } from "react";
import { errorMessage } from "../api/client";

export interface Resource<T> {
  data: T | undefined;
  error: string | null;
  loading: boolean;
  reload: () => Promise<void>;
  setData: (update: T | ((previous: T | undefined) => T)) => void;
}

/** Load `fetcher()` now and whenever `key` changes; the latest answer wins. */
export function useResource<T>(key: string | null, fetcher: () => Promise<T>): Resource<T> {
  const [data, setDataState] = useState<T | undefined>(undefined);
  const [error, setError] = useState<string | null>(null);
  const [loading, setLoading] = useState<boolean>(key !== null);
  const generation = useRef(0);
  const fetcherRef = useRef(fetcher);
  fetcherRef.current = fetcher;

  const reload = useCallback(async () => {
    if (key === null) return;
    const mine = ++generation.current;
    setLoading(true);
    try {
      const value = await fetcherRef.current();
      if (mine !== generation.current) return;
      setDataState(value);
      setError(null);
    } catch (caught) {
      if (mine !== generation.current) return;
      setError(errorMessage(caught));
    } finally {
      if (mine === generation.current) setLoading(false);
    }
  }, [key]);

  useEffect(() => {
    void reload();
  }, [reload]);

  const setData = useCallback((update: T | ((previous: T | undefined) => T)) => {
    setDataState((previous) =>
      typeof update === "function" ? (update as (p: T | undefined) => T)(previous) : update,
    );
  }, []);

  return { data, error, loading, reload, setData };
}

export interface ApiList<T> extends Resource<T[]> {
  /** The error of the last failed `act`, shown next to the list's own load error. */
  actionError: string | null;
  setActionError: (error: string | null) => void;
  /**
   * Run `action` (a create, an update, a delete…), then reload the list (and
   * `alsoReload`, at the same time). A failure lands in `actionError`.
   */
  act: (action: () => Promise<unknown>, alsoReload?: () => Promise<unknown>) => Promise<void>;
}

/** A list from the API that the page can change: `useResource` plus the act-then-refresh pattern. */
export function useApiList<T>(key: string | null, fetcher: () => Promise<T[]>): ApiList<T> {
  const resource = useResource<T[]>(key, fetcher);
  const [actionError, setActionError] = useState<string | null>(null);
  const { reload } = resource;
  const act = useCallback(
    async (action: () => Promise<unknown>, alsoReload?: () => Promise<unknown>) => {
      try {
        await action();
        await Promise.all([reload(), alsoReload ? alsoReload() : Promise.resolve()]);
      } catch (caught) {
        setActionError(errorMessage(caught));
      }
    },
    [reload],
  );
  return { ...resource, actionError, setActionError, act };
}

/** Re-render every `ms` (relative times, live durations). */
export function useNow(ms = 15_000): number {
  const [now, setNow] = useState(() => Date.now());
  useEffect(() => {
    const timer = setInterval(() => setNow(Date.now()), ms);
    return () => clearInterval(timer);
  }, [ms]);
  return now;
}

/** Re-run `callback` every `ms` while mounted. */
export function useInterval(callback: () => void, ms: number | null): void {
  const ref = useRef(callback);
  ref.current = callback;
  useEffect(() => {
    if (ms === null) return undefined;
    const timer = setInterval(() => ref.current(), ms);
    return () => clearInterval(timer);
  }, [ms]);
}

const WORKSPACE_KEY = "trainyard.workspace";

export function rememberWorkspace(slug: string): void {
  try {
    localStorage.setItem(WORKSPACE_KEY, slug);
  } catch {
    // Private mode or storage disabled: the switcher still works for this page.
  }
}

export function rememberedWorkspace(): string | null {
  try {
    return localStorage.getItem(WORKSPACE_KEY);
  } catch {
    return null;
  }
}
