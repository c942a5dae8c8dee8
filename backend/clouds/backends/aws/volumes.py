"""EBS volumes as the contract's persistent volumes (docs/DATA.md, "Volumes").

A volume is made in one zone with every tag a machine carries for this
installation and account, plus ``trainyard:volume`` = the Volume row's id
(``VOLUME_TAG``): a second create with the same id finds the first volume,
and ``managed`` finds every volume of ours even when its row was lost.
(Machines' root volumes carry the installation tags too, never
``trainyard:volume``.) A volume is attached as the first of ``/dev/sdf`` …
``/dev/sdp`` the machine does not use; on Nitro machines it shows up as
``/dev/nvme…`` with the link ``/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_vol…``,
which is what the runner looks for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from backend.clouds.backends.aws.errors import compute_error, error_code
from backend.clouds.backends.aws.facts import AccountFacts
from backend.clouds.backends.aws.machines import ACCOUNT_TAG, INSTALLATION_TAG
from backend.clouds.backends.aws.session import AwsAuth, client
from backend.clouds.backends.base import Handle, VolumeInfo, VolumeSpec, VolumeState
from backend.clouds.backends.errors import InvalidConfig, Transient

VOLUME_TAG = "trainyard:volume"
DEVICES = tuple(f"/dev/sd{letter}" for letter in "fghijklmnop")
GIB = 2**30
MIN_GIB = 1
MAX_GIB = 16384  # gp3's largest volume
NOT_FOUND = ("InvalidVolume.NotFound", "InvalidVolumeID.Malformed")
_STATES: Mapping[str, VolumeState] = {
    "creating": "creating",
    "available": "available",
    "in-use": "in-use",
    "deleting": "deleting",
    "deleted": "deleted",
    "error": "deleted",
}


class EbsVolumes:
    """EBS calls of one account; regions are the account's configured ones."""

    def __init__(self, auth: AwsAuth, *, installation: str, account_id: str, regions: Sequence[str]) -> None:
        self.auth = auth
        self.installation = installation
        self.account_id = account_id
        self.regions = tuple(regions)

    def create(self, spec: VolumeSpec, facts: AccountFacts | None) -> VolumeInfo:
        """CreateVolume (gp3) in ``spec.zone`` (else the region's first zone),
        unless a volume tagged with ``spec.key`` exists already."""
        if spec.region not in self.regions:
            raise InvalidConfig(
                f"region {spec.region} is not one of the aws account's regions ({', '.join(self.regions)}); "
                "add it to the account's 'regions' or pick one of those",
                code="VolumeRegion",
            )
        for found in self._volumes(spec.region, {VOLUME_TAG: spec.key}):
            return _info(found, spec.region)
        zone = spec.zone or self._first_zone(spec.region, facts)
        size_gib = max(MIN_GIB, -(-spec.size_bytes // GIB))
        if size_gib > MAX_GIB:
            raise InvalidConfig(f"an EBS volume holds at most {MAX_GIB} GiB; {size_gib} GiB asked", code="VolumeSize")
        tags = {
            "Name": f"trainyard-{spec.name}",
            **spec.tags,
            VOLUME_TAG: spec.key,
            INSTALLATION_TAG: self.installation,
            ACCOUNT_TAG: self.account_id,
        }
        answer = self._call(
            "CreateVolume",
            spec.region,
            lambda ec2: ec2.create_volume(
                AvailabilityZone=zone,
                Size=size_gib,
                VolumeType="gp3",
                TagSpecifications=[
                    {"ResourceType": "volume", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}
                ],
            ),
        )
        return _info(answer, spec.region, key=spec.key)

    def attach(self, volume: VolumeInfo, machine: Handle) -> str:
        """The device the volume is attached as on ``machine``: its current
        one when it is attached there already, else AttachVolume as the
        first free name of ``DEVICES``. ``Transient`` while it is attached
        to another machine (the caller detaches it first)."""
        region = volume.region or machine.region
        now = self._one(volume, region)
        if now.attached_to == machine.backend_id and now.device:
            return now.device
        if now.attached_to:
            raise Transient(f"{volume.backend_id} is still attached to {now.attached_to}", code="VolumeInUse")
        used = self._devices_of(machine.backend_id, region)
        device = next((d for d in DEVICES if d not in used and d.replace("/dev/sd", "/dev/xvd") not in used), "")
        if not device:
            raise Transient(f"{machine.backend_id} has no free device name left ({DEVICES[0]}…{DEVICES[-1]})")
        self._call(
            "AttachVolume",
            region,
            lambda ec2: ec2.attach_volume(VolumeId=volume.backend_id, InstanceId=machine.backend_id, Device=device),
        )
        return device

    def detach(self, volume: VolumeInfo, machine: Handle) -> None:
        region = volume.region or machine.region
        now = self._one(volume, region)
        if now.state == "not_found" or now.attached_to != machine.backend_id:
            return
        try:
            client(self.auth, "ec2", region).detach_volume(VolumeId=volume.backend_id, InstanceId=machine.backend_id)
        except (ClientError, BotoCoreError) as exc:
            if error_code(exc) in (*NOT_FOUND, "IncorrectState", "InvalidAttachment.NotFound"):
                return
            raise compute_error(exc, action="DetachVolume", region=region) from exc

    def delete(self, volume: VolumeInfo) -> None:
        now = self._one(volume, volume.region)
        if now.state in ("not_found", "deleted"):
            return
        if now.attached_to:
            raise Transient(f"{volume.backend_id} is still attached to {now.attached_to}", code="VolumeInUse")
        try:
            client(self.auth, "ec2", volume.region).delete_volume(VolumeId=volume.backend_id)
        except (ClientError, BotoCoreError) as exc:
            if error_code(exc) in NOT_FOUND:
                return
            raise compute_error(exc, action="DeleteVolume", region=volume.region) from exc

    def describe(self, volumes: Sequence[VolumeInfo]) -> dict[str, VolumeInfo]:
        return {v.key: self._one(v, v.region) for v in volumes}

    def managed(self) -> list[VolumeInfo]:
        """Every live volume tagged with this installation, account and a volume id, in every region."""
        found: list[VolumeInfo] = []
        for region in self.regions:
            tags = {INSTALLATION_TAG: self.installation, ACCOUNT_TAG: self.account_id}
            for volume in self._volumes(region, tags, keyed=True):
                found.append(_info(volume, region))
        return found

    # ------------------------------------------------------------------ helpers

    def _one(self, volume: VolumeInfo, region: str) -> VolumeInfo:
        if not volume.backend_id:
            return VolumeInfo(key=volume.key, backend_id="", region=region, state="not_found")
        try:
            answer = client(self.auth, "ec2", region).describe_volumes(VolumeIds=[volume.backend_id])
        except (ClientError, BotoCoreError) as exc:
            if error_code(exc) in NOT_FOUND:
                return VolumeInfo(key=volume.key, backend_id=volume.backend_id, region=region, state="not_found")
            raise compute_error(exc, action="DescribeVolumes", region=region) from exc
        found = answer.get("Volumes", [])
        if not found:
            return VolumeInfo(key=volume.key, backend_id=volume.backend_id, region=region, state="not_found")
        return _info(found[0], region, key=volume.key)

    def _volumes(self, region: str, tags: Mapping[str, str], *, keyed: bool = False) -> list[dict[str, Any]]:
        filters = [{"Name": f"tag:{name}", "Values": [value]} for name, value in tags.items()]
        if keyed:
            filters.append({"Name": "tag-key", "Values": [VOLUME_TAG]})
        answer = self._call("DescribeVolumes", region, lambda ec2: ec2.describe_volumes(Filters=filters))
        return [v for v in answer.get("Volumes", []) if v.get("State") not in ("deleting", "deleted")]

    def _devices_of(self, instance_id: str, region: str) -> set[str]:
        answer = self._call("DescribeInstances", region, lambda ec2: ec2.describe_instances(InstanceIds=[instance_id]))
        mappings = [
            m for r in answer.get("Reservations", []) for i in r["Instances"] for m in i.get("BlockDeviceMappings", [])
        ]
        return {str(m.get("DeviceName", "")) for m in mappings}

    def _first_zone(self, region: str, facts: AccountFacts | None) -> str:
        known = facts.regions.get(region) if facts else None
        if known is not None and known.zones:
            return sorted(known.zones.values())[0]
        answer = self._call("DescribeAvailabilityZones", region, lambda ec2: ec2.describe_availability_zones())
        names = sorted(
            str(z["ZoneName"]) for z in answer["AvailabilityZones"] if z.get("State", "available") == "available"
        )
        if not names:
            raise InvalidConfig(f"the aws account has no available zone in {region}", code="VolumeZone")
        return names[0]

    def _call(self, action: str, region: str, call: Any) -> Any:
        try:
            return call(client(self.auth, "ec2", region))
        except (ClientError, BotoCoreError) as exc:
            raise compute_error(exc, action=action, region=region) from exc


def _info(volume: Mapping[str, Any], region: str, *, key: str = "") -> VolumeInfo:
    tags = {str(t["Key"]): str(t["Value"]) for t in volume.get("Tags", [])}
    attachments = [a for a in volume.get("Attachments", []) if a.get("State") in ("attaching", "attached")]
    return VolumeInfo(
        key=key or tags.get(VOLUME_TAG, ""),
        backend_id=str(volume["VolumeId"]),
        region=region,
        zone=str(volume.get("AvailabilityZone", "")),
        size_bytes=int(volume.get("Size", 0)) * GIB,
        state=_STATES.get(str(volume.get("State", "")), "available"),
        attached_to=str(attachments[0]["InstanceId"]) if attachments else "",
        device=str(attachments[0].get("Device", "")) if attachments else "",
    )
