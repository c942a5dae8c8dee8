import { useEffect, useState, type FormEvent } from "react";
import { useSearchParams } from "react-router-dom";
import { errorMessage, get, post } from "../api/client";
import type { DeviceDecision, DeviceRequest } from "../api/types";
import { useAuth } from "../auth";
import { ErrorBanner, Time } from "../components/ui";

const devicePath = (code: string, rest = "") => `/api/v1/auth/device/${encodeURIComponent(code.trim())}/${rest}`;

/** `trainyard login` in the browser: the signed-in person enters the code
 * the CLI shows (or arrives with it in `?code=`), sees what asks to sign in,
 * and approves or denies it. */
export function DevicePage() {
  const { me } = useAuth();
  const [params, setParams] = useSearchParams();
  const [code, setCode] = useState(params.get("code") ?? "");
  const [request, setRequest] = useState<DeviceRequest | null>(null);
  const [decision, setDecision] = useState<DeviceDecision | null>(null);
  const [error, setError] = useState<string | null>(null);
  const [busy, setBusy] = useState(false);

  const lookUp = async (typed: string) => {
    setBusy(true);
    setError(null);
    setRequest(null);
    try {
      setRequest(await get<DeviceRequest>(devicePath(typed)));
    } catch (caught) {
      setError(errorMessage(caught));
    } finally {
      setBusy(false);
    }
  };

  useEffect(() => {
    const given = params.get("code");
    if (given) void lookUp(given);
  }, [params]);

  const submit = (event: FormEvent) => {
    event.preventDefault();
    setParams({ code: code.trim().toUpperCase() });
  };

  const decide = async (verb: "approve" | "deny") => {
    if (!request) return;
    setBusy(true);
    setError(null);
    try {
      setDecision(await post<DeviceDecision>(devicePath(request.user_code, `${verb}/`)));
    } catch (caught) {
      setError(errorMessage(caught));
    } finally {
      setBusy(false);
    }
  };

  return (
    <main className="signin">
      <div className="signin-card">
        <div className="brand brand-large">
          <span className="brand-mark" aria-hidden="true" />
          Trainyard
        </div>
        <h1>Sign in a device</h1>
        <ErrorBanner error={error} />
        {decision ? (
          <div role="status" className="device-decided">
            {decision.state === "approved" ? (
              <p>
                <strong>{decision.client_name}</strong> is signed in as {me?.username}. You can close this page and go
                back to the terminal.
              </p>
            ) : (
              <p>
                Denied: <strong>{decision.client_name}</strong> was not signed in.
              </p>
            )}
          </div>
        ) : request ? (
          <section className="form-stack" aria-labelledby="device-request">
            <h2 id="device-request" className="device-code">
              {request.user_code}
            </h2>
            <p>
              <strong>{request.client_name}</strong> asks to sign in as <strong>{me?.username}</strong>
              {request.address ? ` from ${request.address}` : ""}. It gets an API token that acts as you in every
              workspace you belong to.
            </p>
            <p className="muted small">
              Asked <Time iso={request.created_at} />; the code expires <Time iso={request.expires_at} />. Approve it
              only if you just ran <code>trainyard login</code> and it shows this code.
            </p>
            <button type="button" className="btn btn-primary btn-block" disabled={busy} onClick={() => void decide("approve")}>
              Approve
            </button>
            <button type="button" className="btn btn-block" disabled={busy} onClick={() => void decide("deny")}>
              Deny
            </button>
          </section>
        ) : (
          <form className="form-stack" onSubmit={submit} aria-label="Enter the code">
            <p>
              Enter the code <code>trainyard login</code> shows in your terminal.
            </p>
            <label>
              Code
              <input
                value={code}
                onChange={(e) => setCode(e.target.value)}
                placeholder="BCDF-GHJK"
                autoComplete="off"
                autoCapitalize="characters"
                spellCheck={false}
                required
              />
            </label>
            <button type="submit" className="btn btn-primary btn-block" disabled={busy}>
              Continue
            </button>
          </form>
        )}
      </div>
    </main>
  );
}
