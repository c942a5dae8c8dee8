"""EC2's instance identity document: the machine a runner runs on, signed by AWS.

A runner on an EC2 machine sends, in its hello, the document the instance
metadata service serves (``/latest/dynamic/instance-identity/document``) and
its RSA-2048 signature (``…/rsa2048``: a base64 PKCS#7 SignedData, SHA-256
with the region's RSA-2048 key). ``identity_verify`` checks the signature
against trusted certificates only, never one the message carries, and
returns the instance, account and region the signed document names.

AWS publishes one RSA-2048 certificate per region ("AWS public certificates
for instance identity document signatures", EC2 user guide);
``identity_certificates.pem`` ships them. cryptography has no public PKCS#7
verification: asn1crypto reads the structure, cryptography checks the RSA
signature (docs/decisions/0088-instance-identity.md).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from asn1crypto import cms
from asn1crypto import x509 as asn1_x509
from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import padding, rsa
from cryptography.hazmat.primitives.serialization import Encoding

from backend.clouds.backends.base import IdentityRefused, MachineIdentity

SHIPPED = Path(__file__).with_name("identity_certificates.pem")
MAX_SIGNATURE_BYTES = 8 * 1024  # AWS's is about 1 KiB
MACHINE_FIELDS = ("instanceId", "accountId", "region")
_HASHES: dict[str, type[hashes.HashAlgorithm]] = {
    "sha256": hashes.SHA256,
    "sha384": hashes.SHA384,
    "sha512": hashes.SHA512,
}


@dataclass(frozen=True)
class Trusted:
    """A certificate the server trusts to sign identity documents, with the
    issuer (DER) and serial that a signature names it by."""

    certificate: x509.Certificate
    issuer: bytes
    serial: int


def identity_verify(*, document: str, signature: str, trusted: Sequence[Trusted]) -> MachineIdentity:
    """The machine the signed document names; ``IdentityRefused`` saying
    why otherwise.

    1. ``signature`` is a base64 PKCS#7 SignedData with one signer, named
       (issuer and serial) by a trusted certificate.
    2. What it signed is its own content when it carries it (the document
       as AWS signed it), else ``document``.
    3. Its signed attributes, when it has them, hold that content's digest,
       and they are what the signature covers; the signature verifies with
       the certificate's RSA key (PKCS#1 v1.5; SHA-256, -384 or -512).
    4. The content is a JSON object naming ``instanceId``, ``accountId``
       and ``region``."""
    signer, content = _signed_data(signature)
    certificate = _signer_certificate(signer, trusted)
    signed = content if content is not None else document.encode()
    _check_signature(signer, signed, certificate)
    return _machine(signed)


def trusted_certificates(pem: str = "") -> tuple[Trusted, ...]:
    """The certificates in ``pem`` (PEM text), or AWS's shipped ones when it is empty."""
    return _load(pem or SHIPPED.read_text())


# ------------------------------------------------------------------ helpers


@lru_cache(maxsize=4)
def _load(pem: str) -> tuple[Trusted, ...]:
    certificates = x509.load_pem_x509_certificates(pem.encode())
    return tuple(_trusted(c) for c in certificates)


def _trusted(certificate: x509.Certificate) -> Trusted:
    parsed = asn1_x509.Certificate.load(certificate.public_bytes(Encoding.DER))
    return Trusted(certificate, parsed.issuer.dump(), certificate.serial_number)


def _signed_data(signature: str) -> tuple[cms.SignerInfo, bytes | None]:
    try:
        der = base64.b64decode("".join(signature.split()), validate=True)
    except (binascii.Error, ValueError):
        raise IdentityRefused("the identity document's signature is not base64") from None
    if not der or len(der) > MAX_SIGNATURE_BYTES:
        raise IdentityRefused(f"the identity document's signature is empty or over {MAX_SIGNATURE_BYTES} bytes")
    try:
        info = cms.ContentInfo.load(der, strict=True)
        if info["content_type"].native != "signed_data":
            raise IdentityRefused("the identity document's signature is not a PKCS#7 SignedData")
        signed = info["content"]
        signers = list(signed["signer_infos"])
        content = signed["encap_content_info"]["content"].native
    except (ValueError, TypeError, KeyError):
        raise IdentityRefused("the identity document's signature is not a PKCS#7 SignedData") from None
    if len(signers) != 1:
        raise IdentityRefused(f"the identity document's signature has {len(signers)} signers, not one")
    return signers[0], content if isinstance(content, bytes) else None


def _signer_certificate(signer: cms.SignerInfo, trusted: Sequence[Trusted]) -> x509.Certificate:
    sid = signer["sid"]
    if sid.name != "issuer_and_serial_number":
        raise IdentityRefused("the identity document's signer is not named by issuer and serial number")
    issuer, serial = sid.chosen["issuer"].dump(), sid.chosen["serial_number"].native
    for candidate in trusted:
        if candidate.serial == serial and candidate.issuer == issuer:
            return candidate.certificate
    raise IdentityRefused(f"the identity document is signed by a certificate not trusted here (serial {serial:x})")


def _check_signature(signer: cms.SignerInfo, content: bytes, certificate: x509.Certificate) -> None:
    algorithm = signer["digest_algorithm"]["algorithm"].native
    if algorithm not in _HASHES:
        raise IdentityRefused(f"the identity document's digest {algorithm} is not accepted (SHA-256/384/512)")
    if signer["signature_algorithm"].signature_algo != "rsassa_pkcs1v15":
        raise IdentityRefused("the identity document's signature is not RSA PKCS#1 v1.5")
    key = certificate.public_key()
    if not isinstance(key, rsa.RSAPublicKey):
        raise IdentityRefused("the trusted certificate has no RSA key")
    digest = _HASHES[algorithm]
    signed = _signed_bytes(signer, content, digest)
    try:
        key.verify(signer["signature"].native, signed, padding.PKCS1v15(), digest())
    except InvalidSignature:
        raise IdentityRefused("the identity document's signature does not verify") from None


def _signed_bytes(signer: cms.SignerInfo, content: bytes, digest: type[hashes.HashAlgorithm]) -> bytes:
    """The content itself, or (with signed attributes) the attributes as a
    DER SET, once their message digest is the content's (RFC 5652, 5.4)."""
    attributes = signer["signed_attrs"]
    if not attributes.native:
        return content
    told = [a["values"][0].native for a in attributes if a["type"].native == "message_digest"]
    hasher = hashes.Hash(digest())
    hasher.update(content)
    if told != [hasher.finalize()]:
        raise IdentityRefused("the identity document is not the one its signature covers")
    encoded: bytes = attributes.dump()
    return b"\x31" + encoded[1:]  # the SET OF tag in place of the [0] IMPLICIT one


def _machine(content: bytes) -> MachineIdentity:
    try:
        document = json.loads(content)
    except ValueError:
        raise IdentityRefused("the identity document is not JSON") from None
    fields = {key: document.get(key) if isinstance(document, dict) else None for key in MACHINE_FIELDS}
    missing = [key for key, value in fields.items() if not isinstance(value, str) or not value]
    if missing:
        raise IdentityRefused(f"the identity document names no {', '.join(missing)}")
    return MachineIdentity(
        machine_id=str(fields["instanceId"]), account=str(fields["accountId"]), region=str(fields["region"])
    )
