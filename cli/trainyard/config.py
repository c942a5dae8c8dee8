"""Where the CLI finds the server, the token and the workspace.

Environment variables win over the file saved by ``trainyard login``
(``$XDG_CONFIG_HOME/trainyard/config.json``, default ``~/.config``; mode 0600):
``TRAINYARD_URL`` (default http://127.0.0.1:8000), ``TRAINYARD_TOKEN``,
``TRAINYARD_WORKSPACE`` (else the server's ``default_workspace``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

DEFAULT_URL = "http://127.0.0.1:8000"


class ConfigError(Exception):
    """The configuration is missing or unreadable; the message says what to do."""


@dataclass(frozen=True)
class Config:
    url: str
    token: str | None
    workspace: str | None

    def require_token(self) -> str:
        if not self.token:
            raise ConfigError("no API token: set TRAINYARD_TOKEN, or run `trainyard login --url URL --token TOKEN`")
        return self.token


def config_path(env: Mapping[str, str] = os.environ) -> Path:
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "trainyard" / "config.json"


def load_config(env: Mapping[str, str] = os.environ) -> Config:
    saved = _read_saved(config_path(env))
    return Config(
        url=(env.get("TRAINYARD_URL") or saved.get("url") or DEFAULT_URL).rstrip("/"),
        token=env.get("TRAINYARD_TOKEN") or saved.get("token") or None,
        workspace=env.get("TRAINYARD_WORKSPACE") or saved.get("workspace") or None,
    )


def save_config(*, url: str, token: str, workspace: str | None, env: Mapping[str, str] = os.environ) -> Path:
    """Write the login file, readable by the user only (it holds a token)."""
    path = config_path(env)
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    data = {"url": url.rstrip("/"), "token": token, **({"workspace": workspace} if workspace else {})}
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
    os.chmod(tmp, 0o600)  # O_CREAT's mode does not apply to an existing file
    os.replace(tmp, path)
    return path


def saved_login(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """What ``trainyard login`` saved (url, token, workspace); {} when nothing is."""
    return _read_saved(config_path(env))


def _read_saved(path: Path) -> dict[str, str]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read {path}: {e}; fix or delete it, or run `trainyard login`") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a JSON object; delete it and run `trainyard login`")
    return {k: v for k, v in data.items() if isinstance(v, str)}
