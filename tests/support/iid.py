"""EC2 instance identity documents signed as AWS signs them, by a test key.

``signed(instance_id=…, region=…)`` gives ``(document, signature)`` as the
instance metadata service serves them: the document's JSON text and its
``rsa2048`` signature (a base64 PKCS#7 SignedData carrying the document,
SHA-256 with RSA, signed attributes, no certificate). The test key's
certificate (``CERTIFICATE_PEM``) is what the server is configured to trust
in the tests (``TRAINYARD_AWS_IDENTITY_CERTIFICATES``, tests/conftest.py);
``OTHER`` is a key the server does not trust. Keys are made once per
process.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import cached_property

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.hazmat.primitives.serialization import pkcs7
from cryptography.x509.oid import NameOID

ACCOUNT_ID = "123456789012"  # moto's account, the one a connected test backend records


@dataclass(frozen=True)
class Signer:
    name: str

    @cached_property
    def key(self) -> rsa.RSAPrivateKey:
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)

    @cached_property
    def certificate(self) -> x509.Certificate:
        subject = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, self.name)])
        now = datetime.now(UTC)
        return (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(days=1))
            .not_valid_after(now + timedelta(days=3650))
            .sign(self.key, hashes.SHA256())
        )

    @property
    def certificate_pem(self) -> str:
        return self.certificate.public_bytes(serialization.Encoding.PEM).decode()

    def sign(self, document: str) -> str:
        """The ``rsa2048`` answer for ``document``: base64 DER, 64 characters a line."""
        der = (
            pkcs7.PKCS7SignatureBuilder()
            .set_data(document.encode())
            .add_signer(self.certificate, self.key, hashes.SHA256())
            .sign(serialization.Encoding.DER, [pkcs7.PKCS7Options.Binary, pkcs7.PKCS7Options.NoCerts])
        )
        text = base64.b64encode(der).decode()
        return "\n".join(text[i : i + 64] for i in range(0, len(text), 64))


TEST = Signer("Trainyard tests: EC2 identity")  # trusted by the server in the tests
OTHER = Signer("Someone else")  # trusted by nobody


def document(
    *,
    instance_id: str,
    region: str = "us-east-1",
    account_id: str = ACCOUNT_ID,
    instance_type: str = "g5.xlarge",
    zone: str = "",
) -> str:
    """An instance identity document as EC2 serves it (pretty-printed JSON)."""
    return json.dumps(
        {
            "accountId": account_id,
            "architecture": "x86_64",
            "availabilityZone": zone or f"{region}a",
            "imageId": "ami-12c6146b",
            "instanceId": instance_id,
            "instanceType": instance_type,
            "pendingTime": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "privateIp": "10.0.0.12",
            "region": region,
            "version": "2017-09-30",
        },
        indent=2,
    )


def signed(*, signer: Signer = TEST, **fields: str) -> tuple[str, str]:
    """``(document, signature)`` of a document with ``fields`` (see ``document``)."""
    text = document(**fields)
    return text, signer.sign(text)


def certificate_pem() -> str:
    return TEST.certificate_pem
