"""Cloning a private repository with its credential: real git against a real
HTTP remote that demands Basic auth (tests/support/git_http.py)."""

from __future__ import annotations

import asyncio
import base64
import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from trainyard_runner import code as code_module
from trainyard_runner.code import CodeError, prepare_code
from trainyard_runner.protocol import CodeSpec, GitCredential

from tests.support.git_http import GitHttpServer

TOKEN = "ghp_privateRepoToken123456"


@pytest.fixture
def remote(tmp_path: Path) -> Iterator[GitHttpServer]:
    server = GitHttpServer(tmp_path / "served", username="ci-bot", password=TOKEN).start()
    yield server
    server.close()


def _prepare(code: CodeSpec, tmp_path: Path, name: str = "work") -> Path:
    work = tmp_path / name
    tmp = tmp_path / f"{name}-tmp"
    tmp.mkdir()
    asyncio.run(prepare_code(code, work=work, cache_dir=tmp_path / "cache", tmp_dir=tmp))
    return work


def _forms() -> list[str]:
    return [TOKEN, base64.b64encode(f"ci-bot:{TOKEN}".encode()).decode()]


def test_a_private_repo_is_cloned_with_its_token_sent_only_as_a_header(
    tmp_path: Path, repo: tuple[Path, str], remote: GitHttpServer
) -> None:
    path, commit = repo
    url = remote.publish(path, "models.git")
    credential = GitCredential(kind="https-token", username="ci-bot", secret=TOKEN)

    work = _prepare(CodeSpec(kind="git", repo_url=url, commit=commit, credential=credential), tmp_path)

    assert (work / "train.py").read_text() == "print('v1')\n"
    assert any(r.authorized for r in remote.requests)
    # Nothing of the token stays on the runner's disk: not in the mirror's config, not in the work tree.
    for file in (tmp_path / "cache").rglob("*"):
        if file.is_file():
            data = file.read_bytes()
            assert all(form.encode() not in data for form in _forms()), file
    assert TOKEN not in repr(credential)


def test_without_a_credential_the_clone_fails_saying_how_to_set_one(
    tmp_path: Path, repo: tuple[Path, str], remote: GitHttpServer
) -> None:
    path, commit = repo
    url = remote.publish(path, "models.git")

    with pytest.raises(CodeError) as raised:
        _prepare(CodeSpec(kind="git", repo_url=url, commit=commit), tmp_path)

    message = str(raised.value)
    assert message.startswith(f"the repository {url} needs a credential and none is set for it")
    assert f"trainyard repo credential set --url {url} --https-token <token>" in message
    assert "trainyard run --upload" in message
    assert "\n" not in message


def test_a_wrong_token_is_refused_without_showing_it(
    tmp_path: Path, repo: tuple[Path, str], remote: GitHttpServer
) -> None:
    path, commit = repo
    url = remote.publish(path, "models.git")
    wrong = GitCredential(kind="https-token", username="ci-bot", secret="wrong-token-value-987")

    with pytest.raises(CodeError) as raised:
        _prepare(CodeSpec(kind="git", repo_url=url, commit=commit, credential=wrong), tmp_path)

    message = str(raised.value)
    assert message.startswith(f"the repository {url} refused the https-token credential set for it")
    assert "wrong-token-value-987" not in message
    assert base64.b64encode(b"ci-bot:wrong-token-value-987").decode() not in message


def test_the_token_is_scoped_to_the_remotes_origin_and_kept_off_the_command_line(tmp_path: Path) -> None:
    auth = code_module._token_auth(
        "https://git.example.com:8443/team/models.git", GitCredential(kind="https-token", secret=TOKEN)
    )

    assert auth.env["GIT_CONFIG_COUNT"] == "1"
    assert auth.env["GIT_CONFIG_KEY_0"] == "http.https://git.example.com:8443/.extraHeader"
    pair = base64.b64encode(f"x-access-token:{TOKEN}".encode()).decode()
    assert auth.env["GIT_CONFIG_VALUE_0"] == f"Authorization: Basic {pair}"
    assert auth.scrub(f"fatal: {TOKEN} and {pair}") == "fatal: ***** and *****"


def test_an_ssh_key_lives_in_a_0600_file_only_while_git_runs(tmp_path: Path) -> None:
    """An SSH remote nobody listens on: the clone fails, and the key file
    existed with mode 0600 during the clone and is gone after it."""
    key = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ\n-----END OPENSSH PRIVATE KEY-----\n"
    seen: dict[str, object] = {}
    original = code_module._run

    async def spying_run(argv: list[str], timeout: float, *, env: dict[str, str] | None = None) -> tuple[int, str]:
        if env and "GIT_SSH_COMMAND" in env:
            key_file = tmp_path / "work-tmp" / "git-ssh-key"
            seen["mode"] = stat.S_IMODE(os.stat(key_file).st_mode)
            seen["key"] = key_file.read_text()
            seen["command"] = env["GIT_SSH_COMMAND"]
            seen["argv"] = argv
        return await original(argv, timeout, env=env)

    code_module._run = spying_run  # type: ignore[assignment]
    try:
        credential = GitCredential(kind="ssh-key", secret=key)
        with pytest.raises(CodeError) as raised:
            _prepare(
                CodeSpec(
                    kind="git", repo_url="ssh://git@127.0.0.1:1/team/models.git", commit="a" * 40, credential=credential
                ),
                tmp_path,
            )
    finally:
        code_module._run = original  # type: ignore[assignment]

    assert seen["mode"] == 0o600 and seen["key"] == key
    assert "IdentitiesOnly=yes" in str(seen["command"]) and "StrictHostKeyChecking=accept-new" in str(seen["command"])
    assert f"UserKnownHostsFile={tmp_path / 'work-tmp' / 'known_hosts'}" in str(seen["command"])
    assert not any("PRIVATE KEY" in a for a in seen["argv"])  # type: ignore[attr-defined]
    assert not (tmp_path / "work-tmp" / "git-ssh-key").exists()
    assert "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQ" not in str(raised.value)
