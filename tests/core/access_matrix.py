"""Who may call what: the expected status of every route, method and caller.

``tests/core/test_access_matrix.py`` walks the URL configuration (and the
websocket routing) and fails for a route or method missing here, so a new
endpoint cannot ship without saying who may call it. Each entry is a
``Call``: the expected status per caller (built with the profiles below),
and what to send. URL parameters are filled from the test's world (a run,
its job and artifact… of workspace ``acme``; ``PARAMS``), or from
``Call.params`` (names of the world's objects, see ``World.value``).

The callers: nobody (``anonymous``), a signed-in user of another workspace
(``outsider``), acme's ``viewer``, ``member`` and ``admin``, the token of a
runner registered to acme (``runner``, which runs acme's job) and of a
runner of the outsider's workspace (``other_runner``). A denial (4xx) must
leave every table as it was.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

CALLERS = ("anonymous", "outsider", "viewer", "member", "admin", "runner", "other_runner")
USERS = ("outsider", "viewer", "member", "admin")
RUNNERS = ("runner", "other_runner")

Expect = dict[str, int]


@dataclass(frozen=True)
class Call:
    expect: Expect
    body: Any = None
    query: str = ""
    params: dict[str, str] = field(default_factory=dict)
    # Callers whose success must change nothing either (a no-op answered as a success).
    unchanged: tuple[str, ...] = ()


def everyone(status: int) -> Expect:
    """Public: the same answer for every caller."""
    return dict.fromkeys(CALLERS, status)


def public_api(ok: int) -> Expect:
    """Public, but a bearer token must be a user's: a runner's is refused (401), as any unknown token."""
    return {**everyone(ok), **dict.fromkeys(RUNNERS, 401)}


def signed_in(ok: int, *, outsider: int | None = None) -> Expect:
    """Any signed-in user (their own things); no runner token is a user."""
    return {
        "anonymous": 401,
        **dict.fromkeys(USERS, ok),
        **({"outsider": outsider} if outsider is not None else {}),
        **dict.fromkeys(RUNNERS, 401),
    }


def read(ok: int = 200) -> Expect:
    """A workspace read: every member; another workspace's user is told it does not exist."""
    return {**signed_in(ok), "outsider": 404}


def write(ok: int) -> Expect:
    """A workspace change: members and admins; viewers read only."""
    return {**read(ok), "viewer": 403}


def admin(ok: int) -> Expect:
    """A workspace setting: admins only."""
    return {**write(ok), "member": 403}


def only(who: str, ok: int, *, others: int) -> Expect:
    """One caller's own thing (a token): the others are told it does not exist."""
    return {**signed_in(others), who: ok}


def runner(ok: int) -> Expect:
    """A runner's call about its current job: no user token works; another runner is told it does not exist."""
    return {"anonymous": 401, **dict.fromkeys(USERS, 401), "runner": ok, "other_runner": 404}


WS = "api/v1/workspaces/<slug:workspace>"
RUNNER_JOB = "api/v1/runner/jobs/<uuid:job>"
ATTEMPT = "attempt=1"
SSH_KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIJMosvMnzmUDrCYsmfaOAJ/tWsrFUC+Qv/Uz3T2Q78YS laptop"
FILE = {"path": "w.bin", "size": 3, "sha256": "a" * 64}

ROUTES: dict[str, dict[str, Call]] = {
    # ---------------------------------------------------------- public and sign-in
    "admin/": {"GET": Call(everyone(302))},  # Django's admin: staff sessions only, the rest go to its login
    "api/v1/health/": {"GET": Call(everyone(200))},
    "api/v1/schema/": {"GET": Call(public_api(200))},
    "api/v1/docs/": {"GET": Call(public_api(200))},
    "api/v1/auth/config/": {"GET": Call(everyone(200))},
    "api/v1/auth/login/": {"POST": Call(everyone(400), body={"username": "olivia", "password": "wrong"})},
    "api/v1/auth/logout/": {"POST": Call(public_api(204))},
    # `trainyard login` in the browser: anyone may start one and poll (an unknown device code is refused);
    # any signed-in person may look a pending code up and approve or deny it (the code is what proves intent).
    "api/v1/auth/device/": {"POST": Call(everyone(201), body={"client_name": "laptop"})},
    "api/v1/auth/device/token/": {"POST": Call(everyone(400), body={"device_code": "tydev_unknown"})},
    "api/v1/auth/device/<str:user_code>/": {"GET": Call(signed_in(200), params={"user_code": "device_user_code"})},
    "api/v1/auth/device/<str:user_code>/approve/": {
        "POST": Call(signed_in(200), params={"user_code": "device_user_code"})
    },
    "api/v1/auth/device/<str:user_code>/deny/": {
        "POST": Call(signed_in(200), params={"user_code": "device_user_code"})
    },
    # The sign-in form posts; without a GitHub app configured it ends at /?auth_error=…
    "auth/login/<str:backend>/": {"POST": Call(everyone(302), params={"backend": "github"})},
    "auth/complete/<str:backend>/": {"GET": Call(everyone(302), params={"backend": "github"})},
    "runner/wheels/": {"GET": Call(everyone(200))},
    "runner/wheels/<str:project>/": {"GET": Call(everyone(200), params={"project": "trainyard-runner"})},
    "runner/wheels/<str:name>": {"GET": Call(everyone(404), params={"name": "nothing.whl"})},
    "cli/wheels/": {"GET": Call(everyone(200))},
    "cli/wheels/<str:project>/": {"GET": Call(everyone(200), params={"project": "trainyard-cli"})},
    "cli/wheels/<str:name>": {"GET": Call(everyone(404), params={"name": "nothing.whl"})},
    # A job's port in the browser: a signed-in browser session only (a token is no session): everyone
    # here is sent to sign in; who may open it is tests/access/test_apps_grants.py's.
    "open/<slug:workspace>/<str:run>/<str:job>/<int:port>/": {
        "GET": Call(everyone(302), params={"job": "train", "port": "8888"})
    },
    # The dashboard: every client-side route is the app's page.
    "^(?!(?:api/|ws/|admin/|storage|auth/|static/|app\\-assets/)).*$": {"GET": Call(everyone(200))},
    # Signed links: the token is the permission, whoever holds it.
    "storage/<str:token>": {"GET": Call(everyone(200), params={"token": "storage_token"})},
    "storage-archive/<str:token>": {"GET": Call(everyone(200), params={"token": "archive_token"})},
    # ---------------------------------------------------------- the caller
    "api/v1/me/": {"GET": Call(signed_in(200))},
    "api/v1/tokens/": {"GET": Call(signed_in(200)), "POST": Call(signed_in(201), body={"name": "laptop"})},
    "api/v1/tokens/<uuid:token_id>/": {
        "DELETE": Call(only("member", 204, others=404), params={"token_id": "member_token_id"})
    },
    # SSH public keys are a person's: each caller adds and lists their own; another's is not found.
    "api/v1/me/ssh-keys/": {"GET": Call(signed_in(200)), "POST": Call(signed_in(201), body={"public_key": SSH_KEY})},
    "api/v1/me/ssh-keys/<path:key>/": {
        "DELETE": Call(only("member", 204, others=404), params={"key": "member_ssh_key_fingerprint"})
    },
    "api/v1/workspaces/": {"GET": Call(signed_in(200)), "POST": Call(signed_in(201), body={"name": "New Team"})},
    # ---------------------------------------------------------- members
    f"{WS}/members/": {
        "GET": Call(read()),
        "POST": Call(admin(202), body={"github_login": "newcomer", "role": "viewer"}),
    },
    f"{WS}/members/<str:username>/": {
        "PATCH": Call(admin(200), body={"role": "viewer"}, params={"username": "member_username"}),
        "DELETE": Call(admin(204), params={"username": "member_username"}),
    },
    # Pending invitations (who was invited, by whom): admins only.
    f"{WS}/invitations/": {"GET": Call(admin(200))},
    f"{WS}/invitations/<uuid:invitation>/": {"DELETE": Call(admin(204))},
    # The audit log (who changed secrets, credentials, members, backends, tokens, runners): admins only.
    f"{WS}/audit/": {"GET": Call(admin(200))},
    # The workspace's default guards: everyone in it reads them, admins replace them.
    f"{WS}/guards/": {
        "GET": Call(read()),
        "PUT": Call(admin(200), body={"stall": {"timeout": "20m", "action": "restart"}, "utilization_policy": None}),
    },
    # ---------------------------------------------------------- runs
    f"{WS}/runs/": {"GET": Call(read()), "POST": Call(write(201), body="run_body")},
    # A dry run changes nothing: a viewer may plan too.
    f"{WS}/runs/plan/": {"POST": Call(read(200), body="run_body")},
    # Where a new run may start from (the dashboard's New run form): anyone of the workspace reads it.
    f"{WS}/runs/sources/": {"GET": Call(read())},
    f"{WS}/runs/<str:run>/": {"GET": Call(read())},
    f"{WS}/runs/<str:run>/stop/": {"POST": Call(write(202))},
    f"{WS}/runs/<str:run>/rerun/": {"POST": Call(write(201))},
    f"{WS}/runs/<str:run>/lineage/": {"GET": Call(read())},
    f"{WS}/runs/<str:run>/artifacts/": {"GET": Call(read())},
    f"{WS}/runs/<str:run>/exports/": {"GET": Call(read())},
    # Sessions into a job (members and admins): the world's job is assigned, not running yet: told to wait (409).
    f"{WS}/runs/<str:run>/sessions/": {"POST": Call(write(409), body={"kind": "port", "port": 8888})},
    # Everyone sees their own sessions, an admin every one of the workspace.
    f"{WS}/sessions/": {"GET": Call(read())},
    # A run's metrics: read as the run is (members and viewers); another workspace's run is not found.
    f"{WS}/runs/<str:run>/metrics/": {"GET": Call(read())},
    f"{WS}/runs/<str:run>/metrics/series/": {"GET": Call(read(), query="job=hello&names=loss,cpu")},
    f"{WS}/metrics/compare/": {"GET": Call(read(), query="runs=<run>,<done_run>&names=loss")},
    f"{WS}/costs/": {"GET": Call(read(), query="since=30d&by=user")},
    # Budgets: everyone of the workspace sees them and this month's spend; admins set and remove them.
    f"{WS}/budgets/": {"GET": Call(read())},
    f"{WS}/budgets/workspace/": {
        "PUT": Call(admin(200), body={"monthly_limit": "500", "warn_percent": 90}),
        # The world's workspace has no budget: an admin is told so.
        "DELETE": Call(admin(404)),
    },
    f"{WS}/budgets/<str:username>/": {
        "PUT": Call(admin(200), body={"monthly_limit": "50", "gpu_quota": 2}, params={"username": "member_username"}),
        "DELETE": Call(admin(404), params={"username": "member_username"}),
    },
    # The member's own session: they and an admin may end it.
    f"{WS}/sessions/<uuid:session>/end/": {"POST": Call(write(200))},
    f"{WS}/jobs/<uuid:job>/logs/": {"GET": Call(read())},
    f"{WS}/jobs/<uuid:job>/logs/raw": {"GET": Call(read())},
    f"{WS}/blobs/": {"POST": Call(write(201), body=b"patch bytes")},
    f"{WS}/tags/": {"GET": Call(read()), "POST": Call(write(201), body="tag_body")},
    f"{WS}/environments/": {"GET": Call(read())},
    f"{WS}/names/": {"GET": Call(read(), query="kind=run&prefix=")},
    f"{WS}/environments/<str:key>/": {"GET": Call(read(), params={"key": "environment_key"})},
    f"{WS}/environments/<str:key>/lock": {"GET": Call(read(), params={"key": "environment_key"})},
    f"{WS}/tags/<str:name>/": {
        "GET": Call(read(), params={"name": "tag_name"}),
        "DELETE": Call(write(204), params={"name": "tag_name"}),
    },
    f"{WS}/artifacts/<uuid:artifact>/files/<path:path>": {"GET": Call(read(302), params={"path": "file_path"})},
    f"{WS}/artifacts/<uuid:artifact>/archive/": {"GET": Call(read(302))},
    # ---------------------------------------------------------- secrets and repos
    f"{WS}/secrets/": {"GET": Call(read())},
    f"{WS}/secrets/<str:name>/": {
        "PUT": Call(admin(200), body={"value": "new-value"}, params={"name": "secret_name"}),
        "DELETE": Call(admin(204), params={"name": "secret_name"}),
    },
    f"{WS}/repos/": {"GET": Call(read())},
    # Secrets and clone credentials are written by admins only; members read the names.
    f"{WS}/repos/credential/": {
        "PUT": Call(
            admin(200), body={"url": "https://example.com/acme/models.git", "kind": "https-token", "secret": "ghp_x"}
        ),
        "DELETE": Call(admin(204), query="url=https://example.com/acme/private.git"),
    },
    # ---------------------------------------------------------- compute
    f"{WS}/instances/": {"GET": Call(read())},
    # Admins end a machine; acme's only one is its registered self-hosted "box", which is revoked, not
    # terminated: refused with that (ending a cloud machine: tests/clouds/test_instance_terminate.py).
    f"{WS}/instances/<str:name>/terminate/": {"POST": Call(admin(409), params={"name": "box"})},
    f"{WS}/offers/": {"GET": Call(read())},
    f"{WS}/backends/": {
        "GET": Call(read()),
        # Reaches the checks of the body (no bucket), which makes no call to AWS.
        "POST": Call(admin(400), body={"kind": "aws", "access_key_id": "AKIAX", "secret_access_key": "x"}),
    },
    # What to paste into AWS (the external id is not a secret: AWS's own guidance); made on first read.
    f"{WS}/backends/aws/setup/": {"GET": Call(read(200))},
    f"{WS}/backends/<str:name>/": {
        "GET": Call(read(), params={"name": "backend_name"}),
        # The self-hosted backend still has the registered runner: refused, with its name.
        "DELETE": Call(admin(409), params={"name": "backend_name"}),
    },
    f"{WS}/backends/<str:name>/validate/": {"POST": Call(admin(400), params={"name": "backend_name"})},
    # The workspace's S3-compatible data endpoint: members see it (never its secret), admins set it;
    # the world has none, so reading and removing it find nothing.
    f"{WS}/data/endpoint/": {
        "GET": Call(read(404)),
        "PUT": Call(
            admin(200),
            body={"endpoint_url": "https://minio.example.com", "access_key_id": "k", "secret_access_key": "s"},
        ),
        "DELETE": Call(admin(404)),
    },
    # Notifications: admins subscribe for the workspace, members for their own runs (viewers read an
    # empty list); a member sees and manages only their own (the admin's is not found for them).
    f"{WS}/notifications/": {
        "GET": Call(read()),
        "POST": Call(write(201), body={"kind": "slack", "target": "https://1.1.1.1/hook", "events": ["run.failed"]}),
    },
    f"{WS}/notifications/<uuid:pk>/": {
        "GET": Call({**read(200), "viewer": 404}, params={"pk": "member_subscription"}),
        "PATCH": Call(write(200), body={"enabled": False}, params={"pk": "member_subscription"}),
        "DELETE": Call({**admin(204), "member": 404}, params={"pk": "workspace_subscription"}),
    },
    f"{WS}/notifications/<uuid:pk>/test/": {
        "POST": Call({**admin(202), "member": 404}, params={"pk": "workspace_subscription"}),
    },
    f"{WS}/notifications/<uuid:pk>/deliveries/": {
        "GET": Call({**read(200), "viewer": 404}, params={"pk": "member_subscription"}),
    },
    # Volumes: everyone of the workspace lists them, members make and delete them (acme's "scratch"
    # is a folder of its registered machine "box": no cloud call).
    f"{WS}/volumes/": {
        "GET": Call(read()),
        "POST": Call(write(201), body={"name": "fresh", "size": "1GB", "backend": "self-hosted", "machine": "box"}),
    },
    f"{WS}/volumes/<str:name>/": {
        "GET": Call(read(), params={"name": "volume_name"}),
        "DELETE": Call(write(204), params={"name": "volume_name"}),
    },
    f"{WS}/runners/": {"GET": Call(read())},
    # Listed with their prefix and state only (the token is shown once, to the admin who made it).
    f"{WS}/runners/registration-tokens/": {"GET": Call(read(200)), "POST": Call(admin(201), body={"note": "box"})},
    f"{WS}/runners/registration-tokens/<uuid:token>/": {
        "DELETE": Call(admin(204), params={"token": "registration_token_id"})
    },
    # A self-hosted machine's price per hour: admins set it (audited); everyone reads it in the list.
    f"{WS}/runners/<uuid:runner>/": {"PATCH": Call(admin(200), body={"price_per_hour": "1.20"})},
    f"{WS}/runners/<uuid:runner>/revoke/": {"POST": Call(admin(204))},
    # ---------------------------------------------------------- runners
    # A registration token is the permission (it is spent by the first caller).
    "api/v1/runner/register/": {"POST": Call(everyone(201), body="register_body")},
    f"{RUNNER_JOB}/artifacts/": {"POST": Call(runner(201), body={"path": "./out", "files": [FILE]}, query=ATTEMPT)},
    f"{RUNNER_JOB}/checkpoints/": {"POST": Call(runner(400), body={"path": "./ckpt", "files": [FILE]}, query=ATTEMPT)},
    # Idempotent and scoped to the caller's own attempts: for another runner a no-op, the same 204.
    f"{RUNNER_JOB}/checkpoints/done/": {
        "POST": Call({**runner(204), "other_runner": 204}, query=ATTEMPT, unchanged=("other_runner",))
    },
    # The job's secrets and its inputs' file lists: never in the assignment frame (it crosses Redis).
    f"{RUNNER_JOB}/secrets/": {"GET": Call(runner(200), query=ATTEMPT)},
    # The world's job has no input: its own runner is told ./in does not exist (401 for users as everywhere;
    # it is scoped to the current attempt by HoldsCurrentAttempt, as secrets/ above: tests/runs/test_secrets.py).
    f"{RUNNER_JOB}/inputs/": {"GET": Call(runner(404), query=f"{ATTEMPT}&path=./in")},
    # The job's data inputs (inputs: s3://…): the world's job has none, so its holder finds none.
    f"{RUNNER_JOB}/data/": {"GET": Call(runner(404), query=f"{ATTEMPT}&path=imagenet")},
    f"{RUNNER_JOB}/data/url/": {"POST": Call(runner(404), body={"path": "imagenet", "file": "a.bin"}, query=ATTEMPT)},
    # Nothing packed yet: GET finds none; POST hands out the upload; done: no object was put.
    f"{RUNNER_JOB}/environment/": {
        "GET": Call(runner(404), query=f"{ATTEMPT}&key={'e' * 24}"),
        "POST": Call(runner(200), body={"key": "e" * 24, "size": 3, "sha256": "a" * 64}, query=ATTEMPT),
    },
    f"{RUNNER_JOB}/environment/done/": {"POST": Call(runner(409), body={"key": "e" * 24}, query=ATTEMPT)},
    f"{RUNNER_JOB}/caches/": {"POST": Call(runner(400), body={"path": "./cache", "files": [FILE]}, query=ATTEMPT)},
    # Only a failed job whose files the caller's machine keeps: the world's job runs, so its own
    # runner is told there is none too (the kept flow and its refusals: tests/clouds/test_kept_files.py).
    f"{RUNNER_JOB}/kept/": {"POST": Call(runner(404), body={"outcome": "uploaded"}, query=ATTEMPT)},
    f"{RUNNER_JOB}/artifacts/<uuid:artifact>/complete/": {
        "POST": Call(runner(400), query=ATTEMPT, params={"artifact": "uploading_artifact"})
    },
    f"{RUNNER_JOB}/artifacts/<uuid:artifact>/urls/": {
        "POST": Call(runner(200), body={"path": "w.bin"}, query=ATTEMPT, params={"artifact": "uploading_artifact"})
    },
    f"{RUNNER_JOB}/artifacts/<uuid:artifact>/parts/": {
        "POST": Call(
            runner(400),
            body={"path": "w.bin", "parts": [{"number": 1, "sha256": "a" * 64, "etag": "e"}]},
            query=ATTEMPT,
            params={"artifact": "uploading_artifact"},
        )
    },
    # The job's run has no archive (its code is a git commit): the runner is told so.
    f"{RUNNER_JOB}/urls/": {"POST": Call(runner(404), body={"code": "archive"}, query=ATTEMPT)},
}

# Websockets: "open" (accepted) or the close code. The runner's socket takes
# only a runner token; the browser's only a user of the workspace.
WS_OPEN = 1000
WEBSOCKETS: dict[str, Expect] = {
    "ws/runner/": {"anonymous": 4401, **dict.fromkeys(USERS, 4401), "runner": WS_OPEN, "other_runner": WS_OPEN},
    # A session's ends: the runner's takes its runner token and the session's relay key (none here: 4401;
    # another runner is told the session does not exist), the client's only the session's own token.
    "ws/runner/relay/<uuid:session>/": {
        "anonymous": 4401,
        **dict.fromkeys(USERS, 4401),
        "runner": 4401,
        "other_runner": 4404,
    },
    "ws/v1/relay/<uuid:session>/": dict.fromkeys(CALLERS, 4401),
    "ws/v1/workspaces/<slug:workspace>/runs/": {
        **read(WS_OPEN),
        "anonymous": 4401,
        "outsider": 4404,
        "runner": 4401,
        "other_runner": 4401,
    },
    "ws/v1/workspaces/<slug:workspace>/runs/<str:run>/": {
        **read(WS_OPEN),
        "anonymous": 4401,
        "outsider": 4404,
        "runner": 4401,
        "other_runner": 4401,
    },
}
