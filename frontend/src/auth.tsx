import { createContext, useCallback, useContext, useEffect, useMemo, useState, type ReactNode } from "react";
import { ApiError, get, post } from "./api/client";
import type { AuthConfig, Me } from "./api/types";

type Status = "loading" | "signed-out" | "signed-in" | "error";

export interface AuthState {
  status: Status;
  config: AuthConfig;
  me: Me | null;
  error: string | null;
  refresh: () => Promise<void>;
  signOut: () => Promise<void>;
  setMe: (me: Me) => void;
}

const DEFAULT_CONFIG: AuthConfig = { github: false, local_login: false };

const AuthContext = createContext<AuthState | null>(null);

export function AuthProvider({ children }: { children: ReactNode }) {
  const [status, setStatus] = useState<Status>("loading");
  const [config, setConfig] = useState<AuthConfig>(DEFAULT_CONFIG);
  const [me, setMeState] = useState<Me | null>(null);
  const [error, setError] = useState<string | null>(null);

  const refresh = useCallback(async () => {
    const [configResult, meResult] = await Promise.allSettled([
      get<AuthConfig>("/api/v1/auth/config/"),
      get<Me>("/api/v1/me/"),
    ]);
    if (configResult.status === "fulfilled") setConfig(configResult.value);
    if (meResult.status === "fulfilled") {
      setMeState(meResult.value);
      setStatus("signed-in");
      return;
    }
    const reason = meResult.reason;
    setMeState(null);
    if (reason instanceof ApiError && (reason.status === 401 || reason.status === 403)) {
      setStatus("signed-out");
    } else {
      setError(reason instanceof Error ? reason.message : String(reason));
      setStatus("error");
    }
  }, []);

  const signOut = useCallback(async () => {
    await post("/api/v1/auth/logout/");
    setMeState(null);
    setStatus("signed-out");
  }, []);

  const setMe = useCallback((value: Me) => {
    setMeState(value);
    setStatus("signed-in");
  }, []);

  useEffect(() => {
    void refresh();
  }, [refresh]);

  const value = useMemo(
    () => ({ status, config, me, error, refresh, signOut, setMe }),
    [status, config, me, error, refresh, signOut, setMe],
  );
  return <AuthContext.Provider value={value}>{children}</AuthContext.Provider>;
}

export function useAuth(): AuthState {
  const value = useContext(AuthContext);
  if (!value) throw new Error("useAuth outside AuthProvider");
  return value;
}
