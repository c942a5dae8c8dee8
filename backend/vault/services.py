"""Writes and reads of workspace secrets and of repositories' clone
credentials. Plaintext never leaves this module except as a job's
environment and clone credential (fetched by its runner over REST, never
sent through the channel layer), and as the masks logs and reasons are
masked with (``masking.py``).

A secret no key opens (``crypto.Unreadable``: its key was removed before a
rotation re-encrypted it, or the row was altered) is skipped, never raised
through: masking goes on with the readable ones, the secrets list marks it
``readable: false`` with what to do, and a job of its workspace fails before
its commands start with a reason naming it (``job_secrets``;
docs/decisions/0035-unreadable-secrets.md)."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Collection
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from django.db.models import Count, Max

from backend.accounts.models import User, Workspace
from backend.core.errors import ApplicationError
from backend.core.urlcreds import url_without_credentials
from backend.repos.services import repo_get_or_create
from backend.vault.crypto import Unreadable, decrypt, encrypt
from backend.vault.masking import MIN_LENGTH, Masks, masks_of
from backend.vault.models import CredentialKind, RepoCredential, Secret

logger = logging.getLogger(__name__)

NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
MAX_VALUE_BYTES = 64 * 1024


def secret_set(*, workspace: Workspace, user: User, name: str, value: str) -> tuple[Secret, bool]:
    """Create or replace; returns (secret, created)."""
    if not NAME_RE.match(name):
        raise ApplicationError(
            f"{name!r} is not a valid secret name: use letters, digits and _ (an environment variable name)."
        )
    if not value:
        raise ApplicationError("A secret's value cannot be empty.")
    if len(value) < MIN_LENGTH:
        raise ApplicationError(
            f"A secret's value needs at least {MIN_LENGTH} characters: a shorter one cannot be masked in logs"
            " without masking ordinary text too."
        )
    if len(value.encode()) > MAX_VALUE_BYTES:
        raise ApplicationError(f"A secret's value is at most {MAX_VALUE_BYTES // 1024} KiB.")
    secret, created = Secret.objects.update_or_create(
        workspace=workspace, name=name, defaults={"ciphertext": encrypt(value), "created_by": user}
    )
    # This process re-reads at once; others within the cache's half second.
    _mask_cache.pop(str(workspace.pk), None)
    return secret, created


def secret_delete(*, workspace: Workspace, name: str) -> bool:
    deleted, _ = Secret.objects.for_workspace(workspace).filter(name=name).delete()
    _mask_cache.pop(str(workspace.pk), None)
    return bool(deleted)


def secret_unreadable_advice(name: str) -> str:
    """What an admin does about a secret no key opens."""
    return (
        f"secret {name} cannot be decrypted with the server's keys (TRAINYARD_SECRET_KEYS): the key that encrypted"
        f" it was removed before `manage.py rotate_secret_keys` re-encrypted it, or the stored value was altered."
        f" Set it again (`trainyard secrets set {name}`) or delete it (`trainyard secrets rm {name}`)"
    )


@dataclass(frozen=True)
class SecretListed:
    name: str
    created_at: datetime
    updated_at: datetime
    readable: bool
    problem: str  # "" when readable; else what is wrong and what to do


def secret_list(*, workspace: Workspace) -> list[SecretListed]:
    """Names and dates, and whether each value can still be decrypted."""
    listed = []
    for row in Secret.objects.for_workspace(workspace).order_by("name"):
        readable = _plain(row) is not None
        problem = "" if readable else secret_unreadable_advice(row.name)
        listed.append(SecretListed(row.name, row.created_at, row.updated_at, readable, problem))
    return listed


@dataclass(frozen=True)
class SecretEnv:
    env: dict[str, str]  # the readable secrets by name
    unreadable: list[str]  # names of those no key opens


def secret_env(*, workspace_id: UUID, names: Collection[str] | None = None) -> SecretEnv:
    """The workspace's secrets decrypted (only ``names`` when given: a job's
    own); the ones no key opens are named apart (and logged), never raised."""
    env, unreadable = {}, []
    rows = Secret.objects.filter(workspace_id=workspace_id).order_by("name")
    for row in rows if names is None else rows.filter(name__in=list(names)):
        value = _plain(row)
        if value is None:
            unreadable.append(row.name)
        else:
            env[row.name] = value
    if unreadable:
        logger.warning("workspace %s: secrets %s cannot be decrypted", workspace_id, ", ".join(unreadable))
    return SecretEnv(env, unreadable)


def secret_names(*, workspace_id: UUID) -> set[str]:
    """The names of the workspace's secrets: what a workflow may name."""
    return set(Secret.objects.filter(workspace_id=workspace_id).values_list("name", flat=True))


def _plain(row: Secret | RepoCredential) -> str | None:
    try:
        return decrypt(row.ciphertext)
    except Unreadable:
        return None


@dataclass
class _Cached:
    version: tuple[object, ...]
    masks: Masks
    checked: float


_mask_cache: dict[str, _Cached] = {}
_MASK_CACHE_MAX = 2000


def masks_for(*, workspace_id: UUID, extra_key: str = "", extra: Callable[[], list[str]] | None = None) -> Masks:
    """What to hide of this workspace's secrets in its logs and reasons, and
    of ``extra()`` (a run's private values, cached under ``extra_key``;
    values under ``MIN_LENGTH`` characters are not masked: they would hide
    ordinary text).

    Called for every stored log batch, so it is cached per process and
    rebuilt when the workspace's secrets change (count and latest update,
    one cheap query at most every half second).
    """
    key = f"{workspace_id}:{extra_key}" if extra_key else str(workspace_id)
    cached = _mask_cache.get(key)
    now = time.monotonic()
    if cached is not None and now - cached.checked < 0.5:
        return cached.masks
    stats = Secret.objects.filter(workspace_id=workspace_id).aggregate(latest=Max("updated_at"), n=Count("id"))
    creds = RepoCredential.objects.filter(workspace_id=workspace_id).aggregate(latest=Max("updated_at"), n=Count("id"))
    version = (stats["latest"], stats["n"], creds["latest"], creds["n"])
    if cached is None or cached.version != version:
        values = [*secret_env(workspace_id=workspace_id).env.values(), *_credential_values(workspace_id)]
        values += [v for v in (extra() if extra is not None else []) if len(v) >= MIN_LENGTH]
        cached = _Cached(version, masks_of(values), now)
        if len(_mask_cache) >= _MASK_CACHE_MAX:
            _mask_cache.clear()  # a process serving many runs rebuilds rather than grows
        _mask_cache[key] = cached
    cached.checked = now
    return cached.masks


# ------------------------------------------------------- repo credentials

# The username git sends with a token when none is given (GitHub's convention
# for tokens; GitLab and most others accept any non-empty name).
DEFAULT_TOKEN_USERNAME = "x-access-token"
MAX_KEY_BYTES = 16 * 1024


@dataclass(frozen=True)
class GitCredential:
    kind: str  # CredentialKind
    username: str
    secret: str

    def __repr__(self) -> str:  # never the secret
        return f"GitCredential(kind={self.kind!r}, username={self.username!r})"


def repo_credential_set(
    *, workspace: Workspace, user: User, url: str, kind: str, secret: str, username: str = ""
) -> RepoCredential:
    """Create or replace the clone credential of the workspace's repo ``url``
    (recording the repo if no run came from it yet). A credential in the URL
    itself is dropped: the repo's URL is shown to the whole workspace."""
    url = url_without_credentials(url.strip())
    if not url or len(url) > 500:
        raise ApplicationError("Say which repository: its clone URL, at most 500 characters.", extra={"field": "url"})
    secret, username = _checked_credential(url, kind, secret, username.strip())
    repo = repo_get_or_create(workspace=workspace, url=url)
    credential, _ = RepoCredential.objects.update_or_create(
        repo=repo,
        defaults={
            "workspace": workspace,
            "kind": kind,
            "username": username,
            "ciphertext": encrypt(secret),
            "created_by": user,
        },
    )
    _mask_cache.pop(str(workspace.pk), None)
    return credential


def repo_credential_delete(*, workspace: Workspace, url: str) -> bool:
    url = url_without_credentials(url.strip())
    deleted, _ = RepoCredential.objects.for_workspace(workspace).filter(repo__url=url).delete()
    _mask_cache.pop(str(workspace.pk), None)
    return bool(deleted)


def repo_credential_for(*, workspace_id: UUID, repo_id: UUID | None) -> GitCredential | None:
    """The decrypted credential of a repo of the workspace, for the runner of
    one of its jobs; raises ``ApplicationError`` (409) when no key opens it."""
    if repo_id is None:
        return None
    row = RepoCredential.objects.filter(workspace_id=workspace_id, repo_id=repo_id).select_related("repo").first()
    if row is None:
        return None
    secret = _plain(row)
    if secret is None:
        logger.warning("workspace %s: the credential of repo %s cannot be decrypted", workspace_id, repo_id)
        raise ApplicationError(
            f"the clone credential of {row.repo.url} cannot be decrypted with the server's keys"
            " (TRAINYARD_SECRET_KEYS): set it again (`trainyard repo credential set --url …`) or delete it",
            status_code=409,
            extra={"unreadable_credential": row.repo.url},
        )
    return GitCredential(kind=row.kind, username=row.username, secret=secret)


def repo_credential_exists(*, workspace_id: UUID, repo_id: UUID | None) -> bool:
    return repo_id is not None and RepoCredential.objects.filter(workspace_id=workspace_id, repo_id=repo_id).exists()


def _credential_values(workspace_id: UUID) -> list[str]:
    """What of each credential may show up in text: the secret, and for a
    token the ``user:token`` pair a Basic header encodes (``masks_of`` adds
    the base64 and URL-encoded forms)."""
    values = []
    for row in RepoCredential.objects.filter(workspace_id=workspace_id):
        secret = _plain(row)
        if secret is None:
            logger.warning("workspace %s: the credential of repo %s cannot be decrypted", workspace_id, row.repo_id)
            continue
        values.append(secret)
        if row.kind == CredentialKind.HTTPS_TOKEN:
            values.append(f"{row.username or DEFAULT_TOKEN_USERNAME}:{secret}")
    return values


def _checked_credential(url: str, kind: str, secret: str, username: str) -> tuple[str, str]:
    ssh_url = url.startswith("ssh://") or (not re.match(r"^[a-z][a-z0-9+.-]*://", url) and ":" in url)
    if kind == CredentialKind.HTTPS_TOKEN:
        if not url.startswith(("https://", "http://")):
            raise ApplicationError(
                f"{url} is not an http(s):// URL: a token works for HTTPS remotes; for an SSH remote set an SSH"
                " key (--ssh-key-file)."
            )
        token = secret.strip()
        if len(token) < MIN_LENGTH or any(c in token for c in "\r\n"):
            raise ApplicationError(f"A token is one line of at least {MIN_LENGTH} characters.")
        if ":" in username:
            raise ApplicationError("A username cannot contain ':'.")
        return token, username
    if kind == CredentialKind.SSH_KEY:
        if not ssh_url:
            raise ApplicationError(
                f"{url} is not an SSH remote (ssh://… or git@host:path): an SSH key works for SSH remotes; for"
                " HTTPS set a token (--https-token)."
            )
        key = secret.strip().replace("\r\n", "\n") + "\n"
        if key.startswith(("ssh-", "ecdsa-", "sk-")):
            raise ApplicationError("That is a public key: give the private key (the file without .pub).")
        if not (key.startswith("-----BEGIN ") and "PRIVATE KEY-----" in key):
            raise ApplicationError(
                "That is not a private key: expected a file starting with -----BEGIN … PRIVATE KEY-----."
            )
        if "ENCRYPTED" in key.split("\n", 1)[0] or "Proc-Type: 4,ENCRYPTED" in key:
            raise ApplicationError(
                "That key is protected by a passphrase: a runner cannot type it; use a key without one."
            )
        if len(key.encode()) > MAX_KEY_BYTES:
            raise ApplicationError(f"A key is at most {MAX_KEY_BYTES // 1024} KiB.")
        return key, ""
    raise ApplicationError(f"Unknown credential kind {kind!r}: one of https-token, ssh-key.", extra={"field": "kind"})
