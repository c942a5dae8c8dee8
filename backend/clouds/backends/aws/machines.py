"""EC2 instances as the contract sees them: tags, states, handles."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from backend.clouds.backends.base import AccountConfig, CloudState, Handle, LaunchSpec

KEY_TAG = "trainyard:key"
INSTALLATION_TAG = "trainyard:installation"
ACCOUNT_TAG = "trainyard:account"
# States of a machine that is (still) there; adoption and the leak sweep look only at these.
LIVE_STATES = ("pending", "running", "stopping", "stopped")
# Within this long of its launch, an id DescribeInstances does not know is "not visible yet".
NOT_VISIBLE_GRACE = 300.0
# StateReason codes that mean EC2 took a spot machine back.
SPOT_REASONS = ("Server.SpotInstanceTermination", "Server.SpotInstanceShutdown")

_STATES = {
    "pending": CloudState.PENDING,
    "running": CloudState.RUNNING,
    "shutting-down": CloudState.STOPPING,
    "stopping": CloudState.STOPPING,
    "stopped": CloudState.STOPPING,
    "terminated": CloudState.TERMINATED,
}


def machine_tags(account: AccountConfig, spec: LaunchSpec) -> dict[str, str]:
    """Every tag of ``spec`` plus the key, and this account's installation
    and account id (the backend's own, whatever ``spec.tags`` says)."""
    return {
        "Name": spec.instance_name,
        **spec.tags,
        KEY_TAG: spec.idempotency_key,
        INSTALLATION_TAG: account.installation,
        ACCOUNT_TAG: account.account_id,
    }


def cloud_state(instance: Mapping[str, Any]) -> CloudState:
    """pending → PENDING, running → RUNNING, shutting-down/stopping/stopped →
    STOPPING, terminated → TERMINATED; INTERRUPTED as soon as a machine
    going down or gone was reclaimed by EC2 (StateReason
    ``Server.SpotInstanceTermination``, or a spot machine ended by the
    "Server"); anything else NOT_FOUND."""
    name = str(instance.get("State", {}).get("Name", ""))
    state = _STATES.get(name, CloudState.NOT_FOUND)
    if state in (CloudState.TERMINATED, CloudState.STOPPING) and _reclaimed(instance):
        return CloudState.INTERRUPTED
    return state


def handle_of(instance: Mapping[str, Any], region: str, *, key: str) -> Handle:
    """The handle of ``instance``: the same for the RunInstances answer and
    a later DescribeInstances (nothing in it depends on tags)."""
    launched = instance.get("LaunchTime")
    return Handle(
        key=key,
        backend_id=str(instance["InstanceId"]),
        region=region,
        data={
            "instance_type": str(instance.get("InstanceType", "")),
            "zone": str(instance.get("Placement", {}).get("AvailabilityZone", "")),
            "spot": "true" if instance.get("InstanceLifecycle") == "spot" else "false",
            "launched_at": str(launched.timestamp()) if isinstance(launched, datetime) else "",
        },
    )


def tags_of(instance: Mapping[str, Any]) -> dict[str, str]:
    return {str(tag["Key"]): str(tag["Value"]) for tag in instance.get("Tags", [])}


def launched_at(handle: Handle) -> float | None:
    try:
        return float(handle.data.get("launched_at", ""))
    except ValueError:
        return None


def _reclaimed(instance: Mapping[str, Any]) -> bool:
    reason = str(instance.get("StateReason", {}).get("Code", ""))
    if reason in SPOT_REASONS:
        return True
    # A spot machine ended by the "Server" (not by us) was taken back too.
    return instance.get("InstanceLifecycle") == "spot" and reason.startswith("Server.")
