"""A runner on an EC2 machine proves which machine it runs on: its hello
carries the instance identity document and its rsa2048 signature, which the
server checks against the certificates it trusts (here the test key's,
tests/support/iid.py) and against the instance it launched for the token.
Without it, or with another machine's, the hello is refused (4403) and a
security event logged. Real consumer, channel layer and database."""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from asgiref.sync import async_to_sync
from channels.testing import WebsocketCommunicator
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.serialization import pkcs7
from trainyard_runner import protocol

from backend.accounts.models import Workspace
from backend.accounts.services import hash_token
from backend.clouds.backends.aws.identity import trusted_certificates
from backend.clouds.models import BackendKind, CloudAccount, Instance, InstanceStatus
from backend.config.asgi import application
from tests.support import iid

pytestmark = pytest.mark.django_db(transaction=True)

TOKEN = "tyrun_aws-machine-token"
MACHINE = "i-0aaa1111bbbb2222c"
HELLO = protocol.Hello(
    version="test", hostname="ip-10-0-0-12", resources=protocol.Resources(cpus=4, memory_bytes=2**34, disk_bytes=2**36)
)


def _aws_instance(team: Workspace, *, account_id: str = iid.ACCOUNT_ID) -> Instance:
    account = CloudAccount.objects.create(
        workspace=team,
        kind=BackendKind.AWS,
        name="aws",
        config={"regions": ["us-east-1"], "aws_account_id": account_id},
    )
    return Instance.objects.create(
        workspace=team,
        account=account,
        backend=BackendKind.AWS,
        backend_id=MACHINE,
        name="aws-1a2b3c4d",
        region="us-east-1",
        zone="us-east-1a",
        token_hash=hash_token(TOKEN),
        status=InstanceStatus.PROVISIONING,
    )


def _cloud(document: str = "", signature: str = "", instance_id: str = MACHINE) -> protocol.CloudIdentity:
    return protocol.CloudIdentity(
        instance_id=instance_id, region="us-east-1", zone="us-east-1a", document=document, signature=signature
    )


FROM = "203.0.113.7"  # where the hellos come from


def _say_hello(cloud: protocol.CloudIdentity | None) -> dict[str, Any]:
    async def hello() -> dict[str, Any]:
        ws = WebsocketCommunicator(application, "/ws/runner/", headers=[(b"authorization", f"Bearer {TOKEN}".encode())])
        ws.scope["client"] = (FROM, 50123)
        await ws.connect()
        await ws.send_to(text_data=HELLO.model_copy(update={"cloud": cloud}).model_dump_json())
        answer = dict(await ws.receive_output(timeout=5))
        if answer["type"] == "websocket.close":
            await ws.wait()
        else:
            await ws.disconnect()
        return answer

    return async_to_sync(hello)()


def _security_events(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "trainyard.security"]


@pytest.mark.parametrize("cloud", [None, _cloud()], ids=["no-cloud-identity", "unsigned-instance-id"])
def test_a_hello_without_the_identity_document_from_a_cloud_machine_is_refused(
    team: Workspace, cloud: protocol.CloudIdentity | None, caplog: pytest.LogCaptureFixture
) -> None:
    instance = _aws_instance(team)
    caplog.set_level(logging.WARNING, logger="trainyard.security")

    answer = _say_hello(cloud)

    problem = "no signed instance identity document: a runner on an aws machine must send it"
    assert answer == {"type": "websocket.close", "code": protocol.CLOSE_FORBIDDEN, "reason": problem}
    instance.refresh_from_db()
    assert (instance.status, instance.channel_name, instance.connected_at) == (InstanceStatus.PROVISIONING, "", None)
    assert _security_events(caplog) == [
        f"security event runner_identity_refused: instance {instance.pk} ({instance.name}), workspace {team.pk}: "
        f"{problem} (from {FROM})"
    ]


def test_a_hello_with_its_machines_signed_document_is_welcomed(team: Workspace) -> None:
    instance = _aws_instance(team)
    document, signature = iid.signed(instance_id=MACHINE)

    answer = _say_hello(_cloud(document, signature))

    assert answer["type"] == "websocket.send" and json.loads(answer["text"])["type"] == "welcome"
    instance.refresh_from_db()
    assert instance.status == InstanceStatus.IDLE and instance.connected_at is not None


def _forged_with_the_trusted_name(document: str) -> str:
    """Signed by another key in a certificate that copies the trusted one's issuer and serial."""
    trusted = iid.TEST.certificate
    impostor = (
        x509.CertificateBuilder()
        .subject_name(trusted.subject)
        .issuer_name(trusted.issuer)
        .public_key(iid.OTHER.key.public_key())
        .serial_number(trusted.serial_number)
        .not_valid_before(datetime.now(UTC) - timedelta(days=1))
        .not_valid_after(datetime.now(UTC) + timedelta(days=1))
        .sign(iid.OTHER.key, hashes.SHA256())
    )
    der = (
        pkcs7.PKCS7SignatureBuilder()
        .set_data(document.encode())
        .add_signer(impostor, iid.OTHER.key, hashes.SHA256())
        .sign(serialization.Encoding.DER, [pkcs7.PKCS7Options.Binary])
    )
    import base64

    return base64.b64encode(der).decode()


REFUSALS = {
    "another-machine": (
        lambda: iid.signed(instance_id="i-0ccc3333dddd4444e"),
        "the signed identity document names machine i-0ccc3333dddd4444e (not i-0aaa1111bbbb2222c)",
    ),
    "another-account": (
        lambda: iid.signed(instance_id=MACHINE, account_id="999999999999"),
        "the signed identity document names account 999999999999 (not 123456789012)",
    ),
    "another-region": (
        lambda: iid.signed(instance_id=MACHINE, region="eu-west-1"),
        "the signed identity document names region eu-west-1 (not us-east-1)",
    ),
    "an-untrusted-key": (
        lambda: iid.signed(instance_id=MACHINE, signer=iid.OTHER),
        f"the identity document is signed by a certificate not trusted here (serial {iid.OTHER.certificate.serial_number:x})",
    ),
    "a-forged-signature": (
        lambda: (d := iid.document(instance_id=MACHINE), _forged_with_the_trusted_name(d)),
        "the identity document's signature does not verify",
    ),
    "not-base64": (
        lambda: (iid.document(instance_id=MACHINE), "%%%"),
        "the identity document's signature is not base64",
    ),
    "not-pkcs7": (
        lambda: (iid.document(instance_id=MACHINE), "aGVsbG8gd29ybGQ="),
        "the identity document's signature is not a PKCS#7 SignedData",
    ),
}


@pytest.mark.parametrize("case", list(REFUSALS))
def test_a_signed_document_that_is_not_the_machines_own_is_refused(
    team: Workspace, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    instance = _aws_instance(team)
    make, problem = REFUSALS[case]
    document, signature = make()
    caplog.set_level(logging.WARNING, logger="trainyard.security")

    answer = _say_hello(_cloud(document, signature))

    assert answer == {"type": "websocket.close", "code": protocol.CLOSE_FORBIDDEN, "reason": problem[:120]}
    instance.refresh_from_db()
    assert instance.status == InstanceStatus.PROVISIONING
    assert len(_security_events(caplog)) == 1 and _security_events(caplog)[0].endswith(f"{problem} (from {FROM})")


def test_the_document_is_the_one_aws_signed_not_the_one_sent_beside_it(team: Workspace) -> None:
    """A thief who has another machine's signature cannot pair it with a document of its own."""
    _aws_instance(team)
    _, others = iid.signed(instance_id="i-0ccc3333dddd4444e")
    ours = iid.document(instance_id=MACHINE)

    answer = _say_hello(_cloud(ours, others))

    assert answer["code"] == protocol.CLOSE_FORBIDDEN
    assert (
        answer["reason"] == "the signed identity document names machine i-0ccc3333dddd4444e (not i-0aaa1111bbbb2222c)"
    )


def test_an_account_whose_aws_id_is_not_recorded_refuses_every_document(team: Workspace) -> None:
    _aws_instance(team, account_id="")

    answer = _say_hello(_cloud(*iid.signed(instance_id=MACHINE)))

    assert answer["reason"] == "the signed identity document names account 123456789012 (not unrecorded)"


def test_the_shipped_certificates_are_awss_rsa_2048_ones_for_31_regions() -> None:
    shipped = trusted_certificates("")
    assert len(shipped) == 31
    assert {t.certificate.public_key().key_size for t in shipped} == {2048}  # type: ignore[union-attr]
    assert all("Amazon Web Services LLC" in t.certificate.subject.rfc4514_string() for t in shipped)
