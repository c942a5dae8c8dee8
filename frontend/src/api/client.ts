// The one place that talks HTTP to the server: same-origin, session cookie,
// CSRF header on unsafe methods, errors in the API's {"message", "extra"} form.

export class ApiError extends Error {
  readonly status: number;
  readonly extra: Record<string, unknown>;

  constructor(status: number, message: string, extra: Record<string, unknown> = {}) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.extra = extra;
  }
}

export function getCookie(name: string): string {
  const prefix = `${name}=`;
  for (const part of document.cookie.split(";")) {
    const item = part.trim();
    if (item.startsWith(prefix)) return decodeURIComponent(item.slice(prefix.length));
  }
  return "";
}

export function csrfToken(): string {
  return getCookie("csrftoken");
}

type Query = Record<string, string | number | boolean | null | undefined>;

export function withQuery(path: string, query: Query = {}): string {
  const params = new URLSearchParams();
  for (const [key, value] of Object.entries(query)) {
    if (value === undefined || value === null || value === "" || value === false) continue;
    params.set(key, String(value));
  }
  const qs = params.toString();
  return qs ? `${path}?${qs}` : path;
}

export async function api<T>(method: string, path: string, body?: unknown): Promise<T> {
  const headers: Record<string, string> = { Accept: "application/json" };
  if (body !== undefined) headers["Content-Type"] = "application/json";
  if (method !== "GET" && method !== "HEAD") headers["X-CSRFToken"] = csrfToken();
  const response = await fetch(path, {
    method,
    headers,
    credentials: "same-origin",
    body: body === undefined ? undefined : JSON.stringify(body),
  });
  if (response.status === 204) return undefined as T;
  const data = await readJson(response);
  if (!response.ok) throw toError(response, data);
  return data as T;
}

export const get = <T>(path: string, query?: Query) => api<T>("GET", withQuery(path, query));
export const post = <T>(path: string, body?: unknown) => api<T>("POST", path, body ?? {});
export const put = <T>(path: string, body?: unknown) => api<T>("PUT", path, body ?? {});
export const patch = <T>(path: string, body?: unknown) => api<T>("PATCH", path, body ?? {});
export const del = (path: string) => api<void>("DELETE", path);

/** Prefix of every URL of one workspace. */
export function wsPath(workspace: string, rest: string): string {
  return `/api/v1/workspaces/${encodeURIComponent(workspace)}/${rest}`;
}

export function errorMessage(error: unknown): string {
  if (error instanceof ApiError) return error.message;
  if (error instanceof Error) return error.message;
  return String(error);
}

async function readJson(response: Response): Promise<unknown> {
  const text = await response.text();
  if (!text) return null;
  try {
    return JSON.parse(text);
  } catch {
    return text;
  }
}

function toError(response: Response, data: unknown): ApiError {
  if (data && typeof data === "object" && "message" in data) {
    const { message, extra } = data as { message: unknown; extra?: Record<string, unknown> };
    return new ApiError(response.status, String(message), extra ?? {});
  }
  if (data && typeof data === "object" && "detail" in data) {
    return new ApiError(response.status, String((data as { detail: unknown }).detail));
  }
  const fallback = response.status === 404 ? "Not found." : `The server answered ${response.status}.`;
  return new ApiError(response.status, fallback);
}
