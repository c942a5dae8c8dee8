"""The CLI's config file: named profiles, the older single-profile file, and
which profile a command (or an ssh ProxyCommand written earlier) reads."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from trainyard.config import ConfigError, config_for_url, load_config, save_profile, saved_profiles


def config_file() -> Path:
    return Path(os.environ["XDG_CONFIG_HOME"]) / "trainyard" / "config.json"


def write(data: object) -> None:
    config_file().parent.mkdir(parents=True, exist_ok=True)
    config_file().write_text(json.dumps(data))


def test_a_single_profile_file_of_older_versions_is_the_default_profile_and_is_rewritten_on_save() -> None:
    write({"url": "http://old:8000", "token": "trainyard_old", "workspace": "acme"})

    before = load_config()
    save_profile("work", {"url": "http://work:8000/", "token": "trainyard_work"}, replace=True)

    assert (before.url, before.token, before.workspace, before.profile) == (
        "http://old:8000", "trainyard_old", "acme", "default"
    )  # fmt: skip
    assert json.loads(config_file().read_text()) == {
        "profiles": {
            "default": {"url": "http://old:8000", "token": "trainyard_old", "workspace": "acme"},
            "work": {"url": "http://work:8000", "token": "trainyard_work"},
        }
    }
    assert stat.S_IMODE(config_file().stat().st_mode) == 0o600


def test_trainyard_profile_chooses_the_profile_and_the_environment_wins_over_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    write({"profiles": {"default": {"url": "http://a", "token": "ta"}, "b": {"url": "http://b", "token": "tb"}}})
    monkeypatch.setenv("TRAINYARD_PROFILE", "b")

    chosen = load_config()
    monkeypatch.setenv("TRAINYARD_WORKSPACE", "team")
    monkeypatch.setenv("TRAINYARD_TOKEN", "from-env")
    overridden = load_config()

    assert (chosen.url, chosen.token, chosen.workspace) == ("http://b", "tb", None)
    assert (overridden.url, overridden.token, overridden.workspace) == ("http://b", "from-env", "team")


def test_a_missing_or_misnamed_profile_is_an_error_that_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    write({"profiles": {"default": {"url": "http://a", "token": "ta"}}})
    monkeypatch.setenv("TRAINYARD_PROFILE", "lab")
    with pytest.raises(
        ConfigError, match=r"there is no profile 'lab' in .* \(profiles: default\): run `trainyard login --profile lab`"
    ):
        load_config()
    monkeypatch.setenv("TRAINYARD_PROFILE", "../etc")
    with pytest.raises(ConfigError, match="is not a profile name"):
        load_config()


def test_a_workspace_saved_into_a_profile_keeps_its_login() -> None:
    save_profile("default", {"url": "http://a", "token": "ta", "expires_at": "2027-01-01T00:00:00Z"}, replace=True)
    save_profile("default", {"workspace": "team"}, replace=False)
    assert saved_profiles()["default"] == {
        "url": "http://a", "token": "ta", "expires_at": "2027-01-01T00:00:00Z", "workspace": "team"
    }  # fmt: skip


def test_an_ssh_proxy_for_another_profiles_server_signs_in_with_that_profile() -> None:
    write({"profiles": {"default": {"url": "http://a", "token": "ta"}, "work": {"url": "http://w", "token": "tw"}}})
    assert config_for_url("http://w/").token == "tw"
    assert config_for_url("http://a").token == "ta"
    assert config_for_url("http://elsewhere").token == "ta"
