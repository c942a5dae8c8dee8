import { useState, type FormEvent } from "react";
import { csrfToken, errorMessage, post } from "../api/client";
import type { Me } from "../api/types";
import { useAuth } from "../auth";
import { ErrorBanner } from "../components/ui";

export function SignInPage() {
  const { config, setMe } = useAuth();
  const authError = new URLSearchParams(window.location.search).get("auth_error");
  // Where GitHub's sign-in comes back to: the page that asked for it (the device page's code, say).
  const here = window.location.pathname + window.location.search;
  const returnTo = window.location.pathname !== "/" && !authError ? here : null;
  const [username, setUsername] = useState("");
  const [password, setPassword] = useState("");
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);

  const submit = async (event: FormEvent) => {
    event.preventDefault();
    setBusy(true);
    setError(null);
    try {
      setMe(await post<Me>("/api/v1/auth/login/", { username, password }));
    } catch (caught) {
      setError(errorMessage(caught));
    } finally {
      setBusy(false);
    }
  };

  const nothing = !config.github && !config.local_login;
  return (
    <main className="signin">
      <div className="signin-card">
        <div className="brand brand-large">
          <span className="brand-mark" aria-hidden="true" />
          Trainyard
        </div>
        <h1>Sign in</h1>
        <ErrorBanner error={authError} />
        {config.github ? (
          <form method="post" action="/auth/login/github/">
            <input type="hidden" name="csrfmiddlewaretoken" value={csrfToken()} />
            {returnTo ? <input type="hidden" name="next" value={returnTo} /> : null}
            <button type="submit" className="btn btn-primary btn-block">
              Sign in with GitHub
            </button>
          </form>
        ) : null}
        {config.github && config.local_login ? <div className="divider">or</div> : null}
        {config.local_login ? (
          <form onSubmit={submit} className="form-stack" aria-label="Sign in with a password">
            <ErrorBanner error={error} />
            <label>
              Username
              <input autoComplete="username" value={username} onChange={(e) => setUsername(e.target.value)} required />
            </label>
            <label>
              Password
              <input type="password" autoComplete="current-password" value={password} onChange={(e) => setPassword(e.target.value)} required />
            </label>
            <button type="submit" className={`btn btn-block ${config.github ? "" : "btn-primary"}`} disabled={busy}>
              {busy ? "Signing in…" : "Sign in"}
            </button>
            {config.github ? null : (
              <p className="muted small">
                No GitHub app is configured: sign in as <code>admin</code> with the password <code>make run</code> printed.
              </p>
            )}
          </form>
        ) : null}
        {nothing ? <p className="muted">This server has no sign-in method enabled. Ask its operator.</p> : null}
      </div>
    </main>
  );
}
