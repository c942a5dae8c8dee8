"""A local GitHub for sign-in tests: a real HTTP server speaking GitHub's OAuth and user API.

    server = GithubServer(client_id="cid", client_secret="secret",
                          callback_url="http://testserver/auth/complete/github/")
    server.start()
    server.next_user = GithubUser(id=101, login="octo", emails=[{"email": …, "verified": True, "primary": True}])
    server.mode = "deny"        # the person clicks "Cancel" on GitHub's consent page
    server.url, server.api_url  # GITHUB_URL and GITHUB_API_URL (…/api/v3 by default)
    server.requests             # every request received, to assert what was sent
    server.close()

Endpoints: ``GET /login/oauth/authorize`` (checks client_id, redirect_uri,
state and an S256 code_challenge, then redirects back with a code, or with
``error=access_denied`` in "deny" mode), ``POST /login/oauth/access_token``
(checks the client secret, the one-time code, the redirect_uri and the PKCE
code_verifier against the challenge; JSON when ``Accept: application/json``,
else form-encoded, errors as GitHub gives them: HTTP 200 with ``error``),
``GET <api prefix>/user``, ``GET <api prefix>/user/emails`` and
``GET <api prefix>/user/memberships/orgs/<org>`` (200 for each of the user's
``orgs``, else 404) with ``Authorization: token|Bearer <access token>``.
A user's ``orgs`` may change between requests (they left an organization);
``server.revoke_tokens_of(user)`` makes their tokens answer 401 (they took
back the app's access); ``server.api_failing = True`` answers every API
request 502 (GitHub having a bad day).
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import httpx


@dataclass
class GithubUser:
    id: int
    login: str
    name: str | None = None
    email: str | None = None  # the profile's public email
    emails: list[dict[str, Any]] = field(default_factory=list)  # what /user/emails lists
    avatar_url: str = ""
    orgs: list[str] = field(default_factory=list)  # organizations they are an active member of

    def profile(self) -> dict[str, Any]:
        avatar = self.avatar_url or f"https://avatars.example.test/u/{self.id}"
        return {
            "id": self.id,
            "login": self.login,
            "name": self.name,
            "email": self.email,
            "avatar_url": avatar,
            "type": "User",
        }


@dataclass(frozen=True)
class Recorded:
    method: str
    path: str
    query: dict[str, str]
    form: dict[str, str]
    headers: dict[str, str]


@dataclass
class _Grant:
    user: GithubUser
    redirect_uri: str
    code_challenge: str


def s256(verifier: str) -> str:
    """RFC 7636's S256 challenge of a verifier."""
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")


class GithubServer:
    def __init__(self, *, client_id: str, client_secret: str, callback_url: str, api_prefix: str = "/api/v3") -> None:
        self.client_id = client_id
        self.client_secret = client_secret
        self.callback_url = callback_url
        self.api_prefix = api_prefix.rstrip("/")
        self.mode = "approve"
        self.next_user: GithubUser | None = None
        self.requests: list[Recorded] = []
        self.api_failing = False
        self._codes: dict[str, _Grant] = {}
        self._tokens: dict[str, GithubUser] = {}
        self._lock = threading.Lock()
        self._httpd: ThreadingHTTPServer | None = None
        self._port = 0  # kept after close(), so URLs still name the (now closed) port

    # --- lifecycle ---------------------------------------------------------
    def start(self) -> GithubServer:
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
        threading.Thread(target=self._httpd.serve_forever, name="github-stand-in", daemon=True).start()
        return self

    def close(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._port = self._httpd.server_address[1]
            self._httpd = None

    @property
    def url(self) -> str:
        port = self._httpd.server_address[1] if self._httpd is not None else self._port
        assert port, "start() the server first"
        return f"http://127.0.0.1:{port}"

    @property
    def api_url(self) -> str:
        return self.url + self.api_prefix

    def requests_to(self, path: str) -> list[Recorded]:
        return [r for r in self.requests if r.path == path]

    def revoke_tokens_of(self, user: GithubUser) -> None:
        with self._lock:
            self._tokens = {token: u for token, u in self._tokens.items() if u is not user}

    # --- endpoints (return status, headers, body) -----------------------------
    def authorize(self, query: dict[str, str]) -> tuple[int, dict[str, str], bytes]:
        problem = self._authorize_problem(query)
        if problem:
            return 400, {"Content-Type": "text/plain"}, problem.encode()
        if self.mode == "deny":
            params = {
                "error": "access_denied",
                "error_description": "The user has denied your application access.",
                "state": query["state"],
            }
            return 302, {"Location": f"{query['redirect_uri']}?{urlencode(params)}"}, b""
        assert self.next_user is not None, "set server.next_user before signing in"
        code = secrets.token_hex(10)
        with self._lock:
            self._codes[code] = _Grant(self.next_user, query["redirect_uri"], query["code_challenge"])
        return 302, {"Location": f"{query['redirect_uri']}?{urlencode({'code': code, 'state': query['state']})}"}, b""

    def access_token(self, form: dict[str, str], accept: str) -> tuple[int, dict[str, str], bytes]:
        error = self._token_problem(form)
        if error:
            body: dict[str, str] = {"error": error[0], "error_description": error[1]}
        else:
            with self._lock:
                grant = self._codes.pop(form["code"])
                token = "gho_" + secrets.token_hex(16)
                self._tokens[token] = grant.user
            body = {"access_token": token, "token_type": "bearer", "scope": "user:email"}
        if "application/json" in accept:
            return 200, {"Content-Type": "application/json"}, json.dumps(body).encode()
        return 200, {"Content-Type": "application/x-www-form-urlencoded"}, urlencode(body).encode()

    def api(self, path: str, authorization: str) -> tuple[int, dict[str, str], bytes]:
        if self.api_failing:
            return _json(502, {"message": "Server Error"})
        scheme, _, token = authorization.partition(" ")
        user = self._tokens.get(token) if scheme.lower() in {"token", "bearer"} else None
        if user is None:
            return _json(401, {"message": "Bad credentials"})
        if path == f"{self.api_prefix}/user":
            return _json(200, user.profile())
        if path == f"{self.api_prefix}/user/emails":
            return _json(200, user.emails)
        org = path.removeprefix(f"{self.api_prefix}/user/memberships/orgs/")
        if org != path:  # GitHub: 404 for an organization the user is not a member of
            if org.lower() not in {o.lower() for o in user.orgs}:
                return _json(404, {"message": "Not Found"})
            return _json(200, {"state": "active", "role": "member", "organization": {"login": org}})
        return _json(404, {"message": "Not Found"})

    def _authorize_problem(self, q: dict[str, str]) -> str:
        if q.get("client_id") != self.client_id:
            return "unknown client_id"
        if q.get("redirect_uri") != self.callback_url:
            return "The redirect_uri MUST match the registered callback URL for this application."
        if not q.get("state"):
            return "state is required"
        if not q.get("code_challenge") or q.get("code_challenge_method") != "S256":
            return "PKCE with code_challenge_method=S256 is required"
        return ""

    def _token_problem(self, form: dict[str, str]) -> tuple[str, str] | None:
        if form.get("client_id") != self.client_id or form.get("client_secret") != self.client_secret:
            return "incorrect_client_credentials", "The client_id and/or client_secret passed are incorrect."
        with self._lock:
            grant = self._codes.get(form.get("code", ""))
        if grant is None or form.get("redirect_uri") != grant.redirect_uri:
            return "bad_verification_code", "The code passed is incorrect or expired."
        if s256(form.get("code_verifier", "")) != grant.code_challenge:
            return "invalid_grant", "The code_verifier does not match the code_challenge."
        return None


def _json(status: int, body: Any) -> tuple[int, dict[str, str], bytes]:
    return status, {"Content-Type": "application/json"}, json.dumps(body).encode()


def _handler_for(server: GithubServer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            parts = urlsplit(self.path)
            query = dict(parse_qsl(parts.query))
            self._record("GET", parts.path, query, {})
            if parts.path == "/login/oauth/authorize":
                self._send(*server.authorize(query))
            else:
                self._send(*server.api(parts.path, self.headers.get("Authorization", "")))

        def do_POST(self) -> None:
            parts = urlsplit(self.path)
            length = int(self.headers.get("Content-Length") or 0)
            form = dict(parse_qsl(self.rfile.read(length).decode()))
            self._record("POST", parts.path, dict(parse_qsl(parts.query)), form)
            if parts.path == "/login/oauth/access_token":
                self._send(*server.access_token(form, self.headers.get("Accept", "")))
            else:
                self._send(*_json(404, {"message": "Not Found"}))

        def _record(self, method: str, path: str, query: dict[str, str], form: dict[str, str]) -> None:
            server.requests.append(Recorded(method, path, query, form, dict(self.headers.items())))

        def _send(self, status: int, headers: dict[str, str], body: bytes) -> None:
            self.send_response(status)
            for name, value in {**headers, "Content-Length": str(len(body))}.items():
                self.send_header(name, value)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            pass  # quiet test output

    return Handler


def sign_in_with_github(client: Any, server: GithubServer, *, tamper: Any = None) -> Any:
    """Drives a browser's GitHub sign-in: the POST to begin, GitHub over real HTTP, then the callback.

    ``client`` is a Django test client (its session carries state and the
    PKCE verifier); ``tamper(callback_url) -> callback_url`` may alter the
    callback first. Returns the callback's response (a redirect).
    """
    begin = client.post("/auth/login/github/")
    assert begin.status_code == 302, begin
    authorize = httpx.get(begin["Location"], follow_redirects=False, timeout=10)
    assert authorize.status_code == 302, authorize.text
    callback = authorize.headers["location"]
    if tamper is not None:
        callback = tamper(callback)
    parts = urlsplit(callback)
    return client.get(f"{parts.path}?{parts.query}")
