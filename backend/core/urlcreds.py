"""Credentials in URLs (``https://token@host/…``, ``https://user:pass@host/…``).

A repository URL is stored on the run and the repo and shown to everyone in
the workspace, and git quotes it in its errors: a credential in it must go
before it is stored, and out of any text a user sees
(docs/decisions/0037-no-credentials-in-repo-urls.md). The user name of an
SSH URL (``ssh://git@host/…``) is not a secret and is kept; its password is not.
"""

from __future__ import annotations

import re

MASK = "*****"  # the same mask as a workspace secret's (backend.vault.masking)
_SSH_SCHEMES = frozenset({"ssh", "git+ssh", "ssh+git"})
# scheme://userinfo@ — userinfo is everything up to the last "@" before the
# host's end (a password may hold a raw "@").
_AUTHORITY = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<userinfo>[^/?#]*)@")
_IN_TEXT = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*)://(?P<userinfo>[^\s/?#'\"<>]*)@")


def url_without_credentials(url: str) -> str:
    """``url`` without its userinfo; an SSH URL keeps its user name."""
    match = _AUTHORITY.match(url)
    if match is None:
        return url
    user = match["userinfo"].split(":", 1)[0]
    kept = f"{user}@" if match["scheme"].lower() in _SSH_SCHEMES and user else ""
    return f"{match['scheme']}://{kept}{url[match.end() :]}"


def redact_url_credentials(text: str) -> str:
    """``text`` with the credentials of every URL in it masked: ``https://*****@host``,
    ``https://user:*****@host``, ``ssh://git@host`` (an SSH user name is kept)."""
    return _IN_TEXT.sub(_masked, text)


def _masked(match: re.Match[str]) -> str:
    scheme, userinfo = match["scheme"], match["userinfo"]
    user, colon, _ = userinfo.partition(":")
    if scheme.lower() in _SSH_SCHEMES:
        shown = f"{user}:{MASK}" if colon else user
    else:
        shown = f"{user}:{MASK}" if colon and user else MASK
    return f"{scheme}://{shown}@"
