"""Credentials in URLs (``https://token@host/…``, ``https://user:pass@host/…``).

A repository URL is stored on the run and the repo and shown to everyone in
the workspace, and git quotes it in its errors: a credential in it must go
before it is stored, and out of any text a user sees
(docs/decisions/0037-no-credentials-in-repo-urls.md). The user name of an
SSH URL (``ssh://git@host/…``) is not a secret and is kept; its password is not.

Text masked here comes from runners and git (a job's reason): every pass over
it takes time linear in its length (docs/decisions/0081-linear-redaction.md).
"""

from __future__ import annotations

import re

MASK = "*****"  # the same mask as a workspace secret's (backend.vault.masking)
_SSH_SCHEMES = frozenset({"ssh", "git+ssh", "ssh+git"})
# scheme://userinfo@ — userinfo is everything up to the last "@" before the
# host's end (a password may hold a raw "@"). Anchored at the start: one try.
_AUTHORITY = re.compile(r"^(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<userinfo>[^/?#]*)@")
# In text, a URL's credential is ``://userinfo@``, the userinfo being
# everything up to the last "@" before a character that ends an authority.
# The search starts at the literal "://", which the engine finds at C speed,
# and reads each userinfo once: a userinfo holds no "/", so two never overlap.
# The scheme is found afterwards, in the run of scheme characters before the
# "://" (``_scheme_start``). A pattern that starts with the scheme, as
# ``\b[A-Za-z][A-Za-z0-9+.-]*://`` did, tries again at every word boundary of
# a long run (``a.a.a.…``), each try reading the rest of the run: quadratic.
_USERINFO = re.compile(r"://(?P<userinfo>[^\s/?#'\"<>]*)@")
_AUTHORITY_END = re.compile(r"[\s/?#'\"<>]")
_RUN = re.compile(r"[A-Za-z0-9+.-]*+")  # matched on the reversed text: the run that ends before a "://"
_SCHEME_IN_RUN = re.compile(r"[+.-](?=[A-Za-z])")
_WORD = re.compile(r"\w")


def url_without_credentials(url: str) -> str:
    """``url`` without its userinfo; an SSH URL keeps its user name."""
    match = _AUTHORITY.match(url)
    if match is None:
        return url
    user = match["userinfo"].split(":", 1)[0]
    kept = f"{user}@" if match["scheme"].lower() in _SSH_SCHEMES and user else ""
    return f"{match['scheme']}://{kept}{url[match.end() :]}"


def redact_url_credentials(text: str, *, cut: bool = False) -> str:
    """``text`` with the credentials of every URL in it masked: ``https://*****@host``,
    ``https://user:*****@host``, ``ssh://git@host`` (an SSH user name is kept).

    ``cut``: the text may have been cut short, so it may end inside a URL's
    authority, before the "@" that would show it is a credential
    (``…https://user:tok``): such an authority is masked whole (``https://*****``)."""
    if cut:
        at = text.rfind("://")
        if at != -1 and at + 3 < len(text) and not _AUTHORITY_END.search(text, at + 3):
            return _redacted(text[: at + 3]) + MASK
    return _redacted(text)


def _redacted(text: str) -> str:
    parts: list[str] = []
    done = 0  # text[:done] is in parts
    backwards = ""
    for found in _USERINFO.finditer(text):
        at = found.start()
        backwards = backwards or text[::-1]
        run = _RUN.match(backwards, len(text) - at)  # always matches, maybe nothing
        start = _scheme_start(text, at - len(run[0]) if run else at, at)
        if start is None:
            continue  # no scheme before the "://": not a URL
        parts += [text[done:at], "://", _shown(text[start:at], found["userinfo"]), "@"]
        done = found.end()
    if not parts:
        return text
    parts.append(text[done:])
    return "".join(parts)


def _scheme_start(text: str, run_start: int, run_end: int) -> int | None:
    """Where the scheme starts in the run of scheme characters
    ``text[run_start:run_end]``: at its first letter that starts a word (the
    run's first character, or one after a "+", "." or "-"); None if none does."""
    if run_start == run_end:
        return None
    if text[run_start].isalpha() and not (run_start and _WORD.match(text, run_start - 1)):
        return run_start
    inside = _SCHEME_IN_RUN.search(text, run_start, run_end)
    return inside.end() if inside else None


def _shown(scheme: str, userinfo: str) -> str:
    user, colon, _ = userinfo.partition(":")
    if scheme.lower() in _SSH_SCHEMES:
        return f"{user}:{MASK}" if colon else user
    return f"{user}:{MASK}" if colon and user else MASK
