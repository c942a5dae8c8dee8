"""Whether a runner's hello comes from the machine launched for its token.

A token is a bearer string: whoever reads it (a job on the machine, a leaked
log) could say hello with it from anywhere. On a cloud whose machines carry
a document the cloud signed (EC2's instance identity document,
``Compute.signs_identity``), the hello must carry it, and it must name the
machine the server launched for that token: its id, its account and its
region (docs/decisions/0088-instance-identity.md).
"""

from __future__ import annotations

import logging

from django.conf import settings

from backend.clouds.backends.base import Compute, IdentityRefused
from backend.clouds.backends.errors import InvalidConfig
from backend.clouds.backends.registry import compute_class
from backend.clouds.models import BackendKind, Instance
from backend.core.security import security_event

logger = logging.getLogger(__name__)


def instance_identity_problem(
    *, instance: Instance, claimed_id: str, document: str, signature: str, address: str = ""
) -> str:
    """Why the hello is refused, logged as a security event with
    ``address`` (where it came from); empty when it may go on.

    1. A self-hosted machine is the user's: nothing is claimed of it.
    2. A machine whose cloud signs identities: the signed document is
       required, must verify against the trusted certificates, and must name
       the instance's machine (when its launch recorded one), its account's
       cloud id and its region; a claimed id must be that machine.
    3. Any other: a claimed id must be the one recorded (when there is one)."""
    if instance.backend == BackendKind.SELF_HOSTED:
        return ""
    compute = _compute_class(instance.backend)
    if compute is not None and compute.signs_identity:
        problem = _signed_problem(compute, instance, claimed_id, document, signature)
    else:
        problem = _claimed_problem(instance, claimed_id)
    if problem:
        security_event(
            "runner_identity_refused",
            f"instance {instance.pk} ({instance.name}), workspace {instance.workspace_id}: {problem}"
            + (f" (from {address})" if address else ""),
        )
    return problem


def _signed_problem(compute: type[Compute], instance: Instance, claimed_id: str, document: str, signature: str) -> str:
    if not (document and signature):
        return f"no signed instance identity document: a runner on an {instance.backend} machine must send it"
    try:
        machine = compute.identity_of(document=document, signature=signature, trusted_pem=_trusted(instance.backend))
    except IdentityRefused as refused:
        return str(refused)
    expected = {
        "machine": instance.backend_id or machine.machine_id,
        "account": compute.cloud_account_of(instance.account.config if instance.account else {}),
        "region": instance.region,
    }
    found = {"machine": machine.machine_id, "account": machine.account, "region": machine.region}
    wrong = [
        f"{key} {found[key]} (not {expected[key] or 'unrecorded'})" for key in expected if found[key] != expected[key]
    ]
    if claimed_id not in ("", machine.machine_id) and found["machine"] == expected["machine"]:
        wrong.append(f"machine {machine.machine_id} (it claims {claimed_id})")
    return f"the signed identity document names {', '.join(wrong)}" if wrong else ""


def _claimed_problem(instance: Instance, claimed_id: str) -> str:
    if not claimed_id or not instance.backend_id or claimed_id == instance.backend_id:
        return ""
    return f"this runner's token belongs to {instance.name} ({instance.backend_id}), not to machine {claimed_id}"


def _compute_class(kind: str) -> type[Compute] | None:
    try:
        return compute_class(kind, settings.TRAINYARD["BACKEND_KINDS"])
    except (InvalidConfig, ImportError, TypeError):
        return None


def _trusted(kind: str) -> str:
    """The operator's certificates for ``kind``'s identity documents ("": the backend's shipped ones)."""
    return {BackendKind.AWS.value: settings.TRAINYARD["AWS_IDENTITY_CERTIFICATES"]}.get(kind, "")
