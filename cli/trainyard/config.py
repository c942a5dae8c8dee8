"""Where the CLI finds the server, the token and the workspace.

``trainyard login`` saves named profiles in ``$XDG_CONFIG_HOME/trainyard/config.json``
(default ``~/.config``; mode 0600)::

    {"profiles": {"default": {"url": "…", "token": "trainyard_…", "workspace": "…"},
                  "work": {…}}}

The profile in use is ``TRAINYARD_PROFILE`` (the global ``--profile``), else
``default``. A file of the older single-profile shape (``url``, ``token``,
``workspace`` at the top) is read as the profile ``default``, and rewritten in
the shape above the next time something is saved.

Environment variables win over the profile: ``TRAINYARD_URL`` (default
http://127.0.0.1:8000), ``TRAINYARD_TOKEN``, ``TRAINYARD_WORKSPACE`` (the
global ``-w/--workspace``; else the profile's, else the server's
``default_workspace``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DEFAULT_URL = "http://127.0.0.1:8000"
DEFAULT_PROFILE = "default"
PROFILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
PROFILE_KEYS = ("url", "token", "workspace", "expires_at")


class ConfigError(Exception):
    """The configuration is missing or unreadable; the message says what to do."""


@dataclass(frozen=True)
class Config:
    url: str
    token: str | None
    workspace: str | None
    profile: str = DEFAULT_PROFILE

    def require_token(self) -> str:
        if not self.token:
            login = "trainyard login" + ("" if self.profile == DEFAULT_PROFILE else f" --profile {self.profile}")
            raise ConfigError(f"no API token: run `{login}` (or set TRAINYARD_TOKEN)")
        return self.token


def config_path(env: Mapping[str, str] = os.environ) -> Path:
    base = env.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "trainyard" / "config.json"


def profile_in_use(env: Mapping[str, str] = os.environ) -> str:
    """The profile the commands read: ``TRAINYARD_PROFILE``, else ``default``."""
    return check_profile_name(env.get("TRAINYARD_PROFILE") or DEFAULT_PROFILE)


def check_profile_name(name: str) -> str:
    if not PROFILE_NAME.fullmatch(name):
        raise ConfigError(
            f"{name!r} is not a profile name: use letters, digits, '.', '_' and '-' (at most 64, not starting with"
            " '.', '_' or '-')"
        )
    return name


def load_config(env: Mapping[str, str] = os.environ) -> Config:
    profile = profile_in_use(env)
    saved = saved_login(env)
    if not saved and profile != DEFAULT_PROFILE and not env.get("TRAINYARD_TOKEN"):
        known = ", ".join(sorted(saved_profiles(env))) or "none"
        raise ConfigError(
            f"there is no profile {profile!r} in {config_path(env)} (profiles: {known}):"
            f" run `trainyard login --profile {profile}`"
        )
    return Config(
        url=(env.get("TRAINYARD_URL") or saved.get("url") or DEFAULT_URL).rstrip("/"),
        token=env.get("TRAINYARD_TOKEN") or saved.get("token") or None,
        workspace=env.get("TRAINYARD_WORKSPACE") or saved.get("workspace") or None,
        profile=profile,
    )


def saved_login(env: Mapping[str, str] = os.environ) -> dict[str, str]:
    """What the profile in use holds (url, token, workspace, expires_at); {} when nothing."""
    return saved_profiles(env).get(profile_in_use(env), {})


def config_for_url(url: str, env: Mapping[str, str] = os.environ) -> Config:
    """The configuration to reach ``url``: the profile in use when it is that
    server's (or the environment names the token), else the first saved
    profile of that server. What an ssh ProxyCommand written earlier, for a
    server of another profile, signs in with."""
    config = load_config(env)
    if config.url == url.rstrip("/") or env.get("TRAINYARD_TOKEN"):
        return config
    for name, profile in saved_profiles(env).items():
        if profile.get("url") == url.rstrip("/"):
            return load_config({**env, "TRAINYARD_PROFILE": name})
    return config


def saved_profiles(env: Mapping[str, str] = os.environ) -> dict[str, dict[str, str]]:
    """Every saved profile by name."""
    return _profiles_of(config_path(env))


def save_profile(
    name: str, values: Mapping[str, str | None], *, replace: bool, env: Mapping[str, str] = os.environ
) -> Path:
    """Write profile ``name``: with ``replace`` exactly ``values``, else
    ``values`` over what it holds (a None value removes that key). The file
    is readable by the user only: it holds tokens."""
    path = config_path(env)
    profiles = _profiles_of(path)
    profile = {} if replace else dict(profiles.get(name, {}))
    for key, value in values.items():
        if value:
            profile[key] = value.rstrip("/") if key == "url" else value
        else:
            profile.pop(key, None)
    profiles[check_profile_name(name)] = profile
    _write(path, {"profiles": profiles})
    return path


def save_config(*, url: str, token: str, workspace: str | None, env: Mapping[str, str] = os.environ) -> Path:
    """Save ``url``, ``token`` and ``workspace`` as the profile in use."""
    values = {"url": url, "token": token, "workspace": workspace}
    return save_profile(profile_in_use(env), values, replace=True, env=env)


def _write(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(data, f, indent=2)
        f.write("\n")
    os.chmod(tmp, 0o600)  # O_CREAT's mode does not apply to an existing file
    os.replace(tmp, path)


def _profiles_of(path: Path) -> dict[str, dict[str, str]]:
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise ConfigError(f"cannot read {path}: {e}; fix or delete it, or run `trainyard login`") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} is not a JSON object; delete it and run `trainyard login`")
    profiles = data.get("profiles")
    if profiles is None:  # the single-profile file of older versions
        return {DEFAULT_PROFILE: _strings(data)} if any(k in data for k in PROFILE_KEYS) else {}
    if not isinstance(profiles, dict) or not all(isinstance(v, dict) for v in profiles.values()):
        raise ConfigError(f"{path}: 'profiles' must map names to objects; delete it and run `trainyard login`")
    return {str(name): _strings(values) for name, values in profiles.items()}


def _strings(values: Mapping[str, Any]) -> dict[str, str]:
    return {k: v for k, v in values.items() if k in PROFILE_KEYS and isinstance(v, str)}
