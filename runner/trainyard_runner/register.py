"""``trainyard-runner register``: make this machine a self-hosted runner.

The registration token (single use, from the dashboard or the API) is
exchanged over HTTP (``POST <server>/api/v1/runner/register/``) for this
machine's own runner token. The answer is saved as ``<work-dir>/runner.json``
(mode 0600: it holds the token), which a later ``trainyard-runner`` with no
``--server``/``--token`` starts from, with the same identity every time.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

CONFIG_NAME = "runner.json"
TIMEOUT = 30.0


class RegisterError(Exception):
    """Registration failed; the message says why and what to do."""

    def __init__(self, message: str, *, exit_code: int = 2) -> None:
        super().__init__(message)
        self.exit_code = exit_code


@dataclass(frozen=True)
class RunnerConfig:
    server_url: str  # http(s):// base URL of the server
    runner_token: str
    name: str
    runner: str  # the server's id of this machine (its Instance row)
    workspace: str


def register(*, server_url: str, token: str, name: str, work_dir: Path, force: bool = False) -> RunnerConfig:
    """1. Refuse a work dir that is registered already (unless ``force``).
    2. Exchange the token. 3. Save ``runner.json`` (0600)."""
    existing = load_config(work_dir)
    if existing is not None and not force:
        raise RegisterError(
            f"{work_dir / CONFIG_NAME} already registers this machine as {existing.name}; start it with"
            f" `trainyard-runner --work-dir {work_dir}`, or pass --force to register it again as a new machine"
        )
    base = http_base(server_url)
    answer = _post(f"{base}/api/v1/runner/register/", {"token": token, "name": name, "hostname": socket.gethostname()})
    try:
        config = RunnerConfig(
            server_url=base,
            runner_token=str(answer["runner_token"]),
            name=str(answer["name"]),
            runner=str(answer["runner"]),
            workspace=str(answer["workspace"]),
        )
    except (KeyError, TypeError) as e:
        raise RegisterError(
            f"the server's answer is not a registration (missing {e}); is {base} a Trainyard server?"
        ) from None
    save_config(work_dir, config)
    return config


def save_config(work_dir: Path, config: RunnerConfig) -> Path:
    """Written to a 0600 temporary file and renamed: never half-written, never readable by others."""
    work_dir.mkdir(parents=True, exist_ok=True)
    path = work_dir / CONFIG_NAME
    partial = work_dir / f".{CONFIG_NAME}.partial"
    partial.unlink(missing_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(asdict(config), f, indent=2)
        f.write("\n")
    os.replace(partial, path)
    return path


def load_config(work_dir: Path) -> RunnerConfig | None:
    """``<work_dir>/runner.json``; None when there is none. Raises
    ``RegisterError`` when it exists but cannot be used."""
    path = work_dir / CONFIG_NAME
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        raise RegisterError(f"cannot read {path}: {e}") from None
    try:
        return RunnerConfig(**{k: str(data[k]) for k in RunnerConfig.__dataclass_fields__})
    except (KeyError, TypeError) as e:
        raise RegisterError(f"{path} lacks {e}: register the machine again (trainyard-runner register)") from None


def http_base(server_url: str) -> str:
    url = server_url.rstrip("/")
    for ws, http in (("ws://", "http://"), ("wss://", "https://")):
        if url.startswith(ws):
            return http + url[len(ws) :]
    if not url.startswith(("http://", "https://")):
        raise RegisterError(f"--url must be an http(s):// address of the Trainyard server, not {server_url!r}")
    return url


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    token = args.token or os.environ.get("TRAINYARD_REGISTRATION_TOKEN", "")
    if not args.url or not token:
        print("trainyard-runner register: --url and --token are required", file=sys.stderr)
        return 2
    work_dir = Path(args.work_dir).resolve()
    try:
        config = register(server_url=args.url, token=token, name=args.name, work_dir=work_dir, force=args.force)
    except RegisterError as e:
        print(f"trainyard-runner register: {e}", file=sys.stderr)
        return e.exit_code
    print(f"Registered this machine as {config.name} in workspace {config.workspace}.")
    print(f"Its identity is saved in {work_dir / CONFIG_NAME} (mode 0600: it holds the runner token).")
    print("Start the runner with:")
    print(f"  trainyard-runner --work-dir {work_dir}")
    print("or run it as a service: see deploy/trainyard-runner.service.")
    return 0


def _post(url: str, body: dict[str, Any]) -> Any:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT) as resp:
            return json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as e:
        raise RegisterError(f"the server refused the registration (HTTP {e.code}): {_message(e)}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        raise RegisterError(f"cannot reach the server at {url}: {reason}", exit_code=1) from None
    except ValueError:
        raise RegisterError(f"the server at {url} did not answer JSON: is it a Trainyard server?") from None


def _message(error: urllib.error.HTTPError) -> str:
    try:
        data = json.loads(error.read())
    except (OSError, ValueError):
        return error.reason or "no details"
    if isinstance(data, dict) and data.get("message"):
        return str(data["message"])
    return json.dumps(data)[:500]


def _parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(
        prog="trainyard-runner register", description="Register this machine as a self-hosted runner."
    )
    p.add_argument("--url", default=env("TRAINYARD_SERVER_URL"), help="the server, e.g. https://trainyard.example.com")
    p.add_argument("--token", default="", help="a registration token [TRAINYARD_REGISTRATION_TOKEN]")
    p.add_argument("--name", default="", help="the runner's name (default: this host's name)")
    p.add_argument(
        "--work-dir",
        default=env("TRAINYARD_RUNNER_DIR", "./trainyard-runner"),
        help="where runner.json, jobs and the git cache live [TRAINYARD_RUNNER_DIR]",
    )
    p.add_argument("--force", action="store_true", help="register again even if the work dir is registered")
    return p
