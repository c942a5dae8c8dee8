"""A user's SSH public keys: what the runner's SSH server lets them in with
(docs/decisions/0098-ssh-authentication.md).

A key is checked by parsing it (``cryptography``), not by its look: only
ed25519, ECDSA and RSA of at least 2048 bits; DSA, short RSA, certificates
and security-key types are refused by name, and so is a private key pasted
by mistake (the message says it is one, and that it was not stored). The
stored line is the parsed key re-serialised, ``<type> <base64>``; its
fingerprint is the one ``ssh-keygen -l`` prints (SHA256 of the key blob,
base64 without padding).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import uuid
from dataclasses import dataclass

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from django.db import IntegrityError, transaction

from backend.accounts.models import SshKey, User
from backend.core.errors import ApplicationError

# The longest line accepted: an RSA key of 16384 bits is about 2.8 KB.
MAX_KEY_CHARS = 8192
# The runner is sent at most 32 keys per session (trainyard_runner.protocol.OpenRelay).
MAX_KEYS_PER_USER = 32
MIN_RSA_BITS = 2048
ACCEPTED = "ssh-ed25519, ecdsa-sha2-nistp256/384/521, or ssh-rsa of at least 2048 bits"
MAKE_ONE = "make one with `ssh-keygen -t ed25519`"
_TYPES = ("ssh-ed25519", "ecdsa-sha2-nistp256", "ecdsa-sha2-nistp384", "ecdsa-sha2-nistp521", "ssh-rsa")
_PRIVATE_MARKS = ("PRIVATE KEY", "PuTTY-User-Key-File", "OPENSSH PRIVATE")


@dataclass(frozen=True)
class ParsedKey:
    line: str  # "<type> <base64>"
    fingerprint: str  # "SHA256:…"
    comment: str


def ssh_key_parse(text: str) -> ParsedKey:
    """One OpenSSH public key line, checked; ApplicationError saying what is wrong otherwise."""
    text = text.strip()
    if any(mark in text for mark in _PRIVATE_MARKS):
        raise ApplicationError(
            "This is a PRIVATE key: it was not stored, and it should never leave your machine. "
            "Paste the public key instead: the .pub file beside it (e.g. ~/.ssh/id_ed25519.pub).",
            extra={"field": "public_key"},
        )
    if not text:
        raise _invalid("The key is empty: paste one line of a .pub file (e.g. ~/.ssh/id_ed25519.pub).")
    if len(text) > MAX_KEY_CHARS:
        raise _invalid(f"The key is longer than {MAX_KEY_CHARS} characters: paste one line of a .pub file.")
    if "\n" in text or "\r" in text:
        raise _invalid("Paste one key, on one line (add each key on its own).")
    kind, _, rest = text.partition(" ")
    _check_type(kind)
    blob_text, _, comment = rest.strip().partition(" ")
    key = _load(kind, blob_text)
    _check_strength(key)
    line = key.public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH).decode()
    return ParsedKey(line=line, fingerprint=ssh_fingerprint(line), comment=comment.strip()[:100])


def ssh_fingerprint(line: str) -> str:
    """``SHA256:<base64 of the blob's sha256, unpadded>``, as ``ssh-keygen -l`` prints it."""
    blob = base64.b64decode(line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def ssh_key_add(*, user: User, public_key: str, name: str = "") -> SshKey:
    """Registers ``public_key`` for ``user``; named ``name``, else the key's
    comment, else its type. Refused (409) when the user has it already, or
    has ``MAX_KEYS_PER_USER`` keys."""
    parsed = ssh_key_parse(public_key)
    with transaction.atomic():
        # The user's row serialises concurrent adds, so the cap holds.
        User.objects.select_for_update().filter(pk=user.pk).first()
        if SshKey.objects.filter(user=user, fingerprint=parsed.fingerprint).exists():
            raise ApplicationError(f"You have this key already ({parsed.fingerprint}).", status_code=409)
        if SshKey.objects.filter(user=user).count() >= MAX_KEYS_PER_USER:
            raise ApplicationError(
                f"You have {MAX_KEYS_PER_USER} SSH keys, the most one may have: remove one first "
                "(`trainyard ssh-key rm NAME`).",
                status_code=409,
            )
        label = (name.strip() or parsed.comment or parsed.line.split()[0])[:100]
        try:
            with transaction.atomic():
                return SshKey.objects.create(
                    user=user, name=label, public_key=parsed.line, fingerprint=parsed.fingerprint
                )
        except IntegrityError:
            raise ApplicationError(f"You have this key already ({parsed.fingerprint}).", status_code=409) from None


def ssh_key_remove(*, user: User, ref: str) -> SshKey | None:
    """Removes ``user``'s key named by its id, fingerprint or name (one key:
    a name several keys share is refused, naming their fingerprints); None
    when the user has no such key."""
    key = _find(user, ref)
    if key is None:
        return None
    SshKey.objects.filter(pk=key.pk).delete()
    return key


def _find(user: User, ref: str) -> SshKey | None:
    keys = SshKey.objects.filter(user=user)
    by_id = keys.filter(pk=ref).first() if _is_uuid(ref) else None
    if by_id is not None:
        return by_id
    fingerprint = ref if ref.startswith("SHA256:") else f"SHA256:{ref}"
    by_fingerprint = keys.filter(fingerprint=fingerprint).first()
    if by_fingerprint is not None:
        return by_fingerprint
    named = list(keys.filter(name=ref)[:MAX_KEYS_PER_USER])
    if len(named) > 1:
        listed = ", ".join(k.fingerprint for k in named)
        raise ApplicationError(f"{len(named)} of your keys are named {ref!r}: name one by its fingerprint ({listed}).")
    return named[0] if named else None


def _is_uuid(ref: str) -> bool:
    try:
        uuid.UUID(ref)
    except ValueError:
        return False
    return True


def _check_type(kind: str) -> None:
    if kind in _TYPES:
        return
    if kind == "ssh-dss":
        raise _invalid(f"DSA keys (ssh-dss) are refused: they are obsolete and weak; {MAKE_ONE}.")
    if "-cert-" in kind:
        raise _invalid(f"This is an SSH certificate; paste the plain public key ({ACCEPTED}).")
    if kind.startswith("sk-"):
        raise _invalid(f"Security-key types ({kind}) are not supported yet; use {ACCEPTED}.")
    raise _invalid(f"This is not an OpenSSH public key line: it must start with {ACCEPTED}; {MAKE_ONE}.")


def _load(kind: str, blob_text: str) -> serialization.SSHPublicKeyTypes:
    try:
        blob = base64.b64decode(blob_text, validate=True)
        key = serialization.load_ssh_public_key(f"{kind} {blob_text}".encode())
    except (ValueError, binascii.Error, UnsupportedAlgorithm):
        raise _invalid(f"The {kind} key does not parse: paste the whole line of the .pub file, unchanged.") from None
    if not blob:
        raise _invalid("The key has no key data after its type.")
    return key


def _check_strength(key: serialization.SSHPublicKeyTypes) -> None:
    if isinstance(key, rsa.RSAPublicKey) and key.key_size < MIN_RSA_BITS:
        raise _invalid(f"This RSA key has {key.key_size} bits; at least {MIN_RSA_BITS} are needed: {MAKE_ONE}.")
    if not isinstance(key, ed25519.Ed25519PublicKey | ec.EllipticCurvePublicKey | rsa.RSAPublicKey):
        raise _invalid(f"This kind of key is not accepted: use {ACCEPTED}.")


def _invalid(message: str) -> ApplicationError:
    return ApplicationError(message, extra={"field": "public_key"})
