"""One RunInstances, with everything it needs found first
(docs/BACKENDS.md, "Launch, describe, terminate, list_managed").

The ids a launch needs (the AMI and its root device, the VPC and the
subnet of the offer's zone, the security group) are found by ``discover``
when the account's facts are refreshed and stored with them
(``facts.LaunchFacts``), so that a launch from a new process asks EC2 for
none of them. ``Launcher`` takes them from the facts while they were found
for the account's current config (``basis``), else looks them up, and keeps
what it used per process, keyed by region. An id the cloud no longer knows
is dropped, the region's facts are no longer trusted by this launcher, and
the id is looked up again once (``AwsCompute.launch``); the group is created
then if it is gone.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any, TypeVar

from botocore.exceptions import BotoCoreError, ClientError

from backend.clouds.backends.aws.errors import compute_error, error_code
from backend.clouds.backends.aws.facts import AccountFacts, Image, LaunchFacts, Network
from backend.clouds.backends.aws.machines import INSTALLATION_TAG
from backend.clouds.backends.aws.options import AwsOptions
from backend.clouds.backends.aws.session import AwsAuth, client
from backend.clouds.backends.base import Offer
from backend.clouds.backends.errors import ComputeError, InvalidConfig, NoCapacity, Scope, Transient

T = TypeVar("T")

SG_TAG = "trainyard:sg"
SG_ROLE = "runners"  # the value of SG_TAG: what the group is for
RUN_TRIES = 3
RUN_BACKOFF = (0.5, 2.0)  # seconds before the 2nd and 3rd try
TAGGED_RESOURCES = ("instance", "volume", "network-interface")
MAX_ROOT_GIB = 16384  # gp3's largest volume

UBUNTU_OWNER = "099720109477"  # Canonical
UBUNTU_NAMES = (
    "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-*",
    "ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-server-*",
)
DLAMI_OWNER = "amazon"
DLAMI_NAMES = (
    "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 24.04)*",
    "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04)*",
)


@dataclass(frozen=True)
class _Subnets:
    """Where a launch in one region may go: the VPC, whether it is the
    region's default one, the config key that chose it, its subnets."""

    vpc_id: str
    default_vpc: bool
    key: str
    subnets: list[dict[str, Any]]


class Launcher:
    def __init__(
        self, auth: AwsAuth, options: AwsOptions, installation: str, facts: AccountFacts | None = None
    ) -> None:
        self.auth = auth
        self.options = options
        self.installation = installation
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, ...], Any] = {}
        self._facts = facts
        self._distrusted: set[str] = set()  # regions whose stored ids proved stale

    def params(
        self,
        offer: Offer,
        *,
        gpu: bool,
        token: str,
        tags: Mapping[str, str],
        user_data: str,
        facts: AccountFacts | None,
    ) -> dict[str, Any]:
        """The RunInstances request for ``offer``."""
        region = offer.region
        image = self.image(region, gpu=gpu)
        network = self.network(region, offer.zone)
        tag_list = [{"Key": k, "Value": v} for k, v in tags.items()]
        disk_gib = min(max(-(-offer.disk_bytes // 2**30), image.min_gib), MAX_ROOT_GIB)
        params: dict[str, Any] = {
            "ImageId": image.image_id,
            "InstanceType": offer.instance_type,
            "MinCount": 1,
            "MaxCount": 1,
            "ClientToken": token,
            "SecurityGroupIds": [self.security_group(region, network.vpc_id)],
            "InstanceInitiatedShutdownBehavior": "terminate",
            "MetadataOptions": {"HttpTokens": "required", "HttpPutResponseHopLimit": 1, "HttpEndpoint": "enabled"},
            "BlockDeviceMappings": [
                {
                    "DeviceName": image.root_device,
                    "Ebs": {"VolumeSize": disk_gib, "VolumeType": "gp3", "DeleteOnTermination": True},
                }
            ],
            "TagSpecifications": [{"ResourceType": kind, "Tags": tag_list} for kind in TAGGED_RESOURCES],
        }
        if user_data:
            params["UserData"] = user_data  # boto3 base64-encodes it
        if network.subnet_id:
            params["SubnetId"] = network.subnet_id
        if offer.zone:
            params["Placement"] = {"AvailabilityZone": self.zone_name(region, offer.zone, facts)}
        if offer.spot:
            params["InstanceMarketOptions"] = {
                "MarketType": "spot",
                "SpotOptions": {"SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"},
            }
        return params

    def run(self, offer: Offer, params: Mapping[str, Any]) -> dict[str, Any]:
        """RunInstances with no retry inside botocore; throttling, 5xx and
        timeouts are retried here with the same ClientToken (≤ 3 tries)."""
        ec2 = client(self.auth, "ec2", offer.region, launch=True)
        for attempt in range(RUN_TRIES):
            try:
                answer: dict[str, Any] = ec2.run_instances(**params)
                return answer
            except (ClientError, BotoCoreError) as exc:
                error = compute_error(
                    exc, action="RunInstances", region=offer.region, instance_type=offer.instance_type, spot=offer.spot
                )
                if not isinstance(error, Transient) or attempt == RUN_TRIES - 1:
                    raise error from exc
            time.sleep(RUN_BACKOFF[attempt])
        raise AssertionError("unreachable")

    def forget(self, region: str) -> None:
        """Drop every cached id of ``region`` (one was stale), and stop
        trusting the region's stored facts: the ids are looked up again."""
        with self._lock:
            self._distrusted.add(region)
            for key in [key for key in self._cache if key[1] == region]:
                del self._cache[key]

    def discover(self, region: str, zone_ids: Iterable[str]) -> tuple[LaunchFacts, list[str]]:
        """The ids a launch in ``region`` needs, looked up now (no cache),
        for the account's facts: both images, the network of each of
        ``zone_ids``, the installation's security group of
        each VPC when it exists (never created here). Best effort: what
        cannot be found is left out (a launch looks it up itself) and named
        in the returned errors."""
        errors: list[str] = []
        images = {}
        for gpu in (False, True):
            image = _noting(errors, f"{region} {_image_kind(gpu)} image", partial(self._image, region, gpu=gpu))
            if image is not None:
                images[_image_kind(gpu)] = image
        networks = _noting(errors, f"{region} subnets", partial(self._networks, region, zone_ids)) or {}
        groups = {}
        ec2 = client(self.auth, "ec2", region)
        for vpc_id in sorted({n.vpc_id for n in networks.values()}):
            group = _noting(errors, f"{region} security group", partial(self._find_group, ec2, region, vpc_id))
            if group:
                groups[vpc_id] = group
        return LaunchFacts(basis=self.basis(region), images=images, networks=networks, security_groups=groups), errors

    def basis(self, region: str) -> str:
        """What the ids of ``region`` depend on (the installation and the
        config keys that choose them), hashed: stored ids found for another
        basis are not used."""
        options = self.options
        chosen = [
            self.installation,
            options.amis.get(region, ""),
            options.gpu_amis.get(region, ""),
            list(options.subnets.get(region, ())),
            options.vpc_ids.get(region, ""),
        ]
        return hashlib.sha256(json.dumps(chosen).encode()).hexdigest()[:16]

    # The ids a launch needs: from the facts, else looked up; each kept per process and region.

    def image(self, region: str, *, gpu: bool) -> Image:
        kind = _image_kind(gpu)
        return self._cached(
            ("image", region, kind), lambda: self._stored(region).images.get(kind) or self._image(region, gpu=gpu)
        )

    def network(self, region: str, zone_id: str) -> Network:
        return self._cached(
            ("network", region, zone_id),
            lambda: self._stored(region).networks.get(zone_id) or self._network(region, zone_id),
        )

    def security_group(self, region: str, vpc_id: str) -> str:
        return self._cached(
            ("sg", region, vpc_id),
            lambda: self._stored(region).security_groups.get(vpc_id) or self._security_group(region, vpc_id),
        )

    def zone_name(self, region: str, zone_id: str, facts: AccountFacts | None) -> str:
        known = facts.regions.get(region) if facts else None
        if known is not None and known.zone_name(zone_id):
            return known.zone_name(zone_id)
        zones = self._cached(("zones", region), lambda: self._zones(region))
        if zone_id not in zones:
            raise NoCapacity(f"zone {zone_id} is not available to the account in {region}", scope=Scope.ZONE)
        return str(zones[zone_id])

    def _stored(self, region: str) -> LaunchFacts:
        """The facts' ids of ``region`` while they can be trusted; else none."""
        known = self._facts.regions.get(region) if self._facts else None
        launch = known.launch if known else None
        with self._lock:
            distrusted = region in self._distrusted
        if launch is None or distrusted or launch.basis != self.basis(region):
            return LaunchFacts(basis="")
        return launch

    def _cached(self, key: tuple[str, ...], find: Callable[[], T]) -> T:
        with self._lock:
            if key in self._cache:
                cached: T = self._cache[key]
                return cached
        found = find()
        with self._lock:
            kept: T = self._cache.setdefault(key, found)
            return kept

    def _image(self, region: str, *, gpu: bool) -> Image:
        key = "gpu_amis" if gpu else "amis"
        image_id = (self.options.gpu_amis if gpu else self.options.amis).get(region, "")
        ec2 = client(self.auth, "ec2", region)
        if image_id:
            images = self._ec2("DescribeImages", region, lambda: ec2.describe_images(ImageIds=[image_id])["Images"])
        else:
            owner, names = (DLAMI_OWNER, DLAMI_NAMES) if gpu else (UBUNTU_OWNER, UBUNTU_NAMES)
            images = self._ec2(
                "DescribeImages",
                region,
                lambda: ec2.describe_images(
                    Owners=[owner],
                    Filters=[
                        {"Name": "name", "Values": list(names)},
                        {"Name": "state", "Values": ["available"]},
                        {"Name": "architecture", "Values": ["x86_64"]},
                    ],
                )["Images"],
            )
        if not images:
            what = "NVIDIA-driver (Deep Learning Base GPU)" if gpu else "Ubuntu 22.04/24.04"
            raise InvalidConfig(
                f"found no {what} image in {region}; set the aws account's config key {key!r} "
                f'to an AMI id for {region} (e.g. {{"{region}": "ami-…"}})',
                code="NoImage",
                scope=Scope.REGION,
            )
        newest = max(images, key=lambda image: str(image.get("CreationDate", "")))
        root = str(newest.get("RootDeviceName") or "/dev/sda1")
        sizes = [
            int(m["Ebs"].get("VolumeSize", 0))
            for m in newest.get("BlockDeviceMappings", [])
            if m.get("DeviceName") == root and "Ebs" in m
        ]
        return Image(image_id=str(newest["ImageId"]), root_device=root, min_gib=max(sizes, default=8))

    def _network(self, region: str, zone_id: str) -> Network:
        found = self._subnets(region, zone_id)
        if found.default_vpc and not zone_id:
            return Network(vpc_id=found.vpc_id, subnet_id="")  # EC2 picks a default subnet
        return self._pick(region, zone_id, found.subnets, default_vpc=found.default_vpc, key=found.key)

    def _networks(self, region: str, zone_ids: Iterable[str]) -> dict[str, Network]:
        """``_network`` of each of ``zone_ids`` with one DescribeSubnets; a
        zone without a subnet is left out. (No zone needs none: with facts
        for the region, every offer has a zone.)"""
        found = self._subnets(region, None)
        networks: dict[str, Network] = {}
        for zone_id in zone_ids:
            try:
                networks[zone_id] = self._pick(
                    region, zone_id, found.subnets, default_vpc=found.default_vpc, key=found.key
                )
            except NoCapacity:
                continue
        return networks

    def _subnets(self, region: str, zone_id: str | None) -> _Subnets:
        """The configured subnets, else those of the configured VPC or the
        default one: of ``zone_id`` when given, of every zone when None;
        none are asked for in the default VPC without a zone ("")."""
        ec2 = client(self.auth, "ec2", region)
        configured = self.options.subnets.get(region, ())
        if configured:
            subnets = self._ec2("DescribeSubnets", region, lambda: ec2.describe_subnets(SubnetIds=list(configured)))
            return _Subnets(vpc_id="", default_vpc=False, key="subnets", subnets=subnets["Subnets"])
        vpc_id = self.options.vpc_ids.get(region, "")
        default = not vpc_id
        if default:
            vpc_id = self._default_vpc(region)
            if zone_id == "":
                return _Subnets(vpc_id=vpc_id, default_vpc=True, key="vpc_ids", subnets=[])
        filters = [{"Name": "vpc-id", "Values": [vpc_id]}]
        if zone_id:
            filters.append({"Name": "availability-zone-id", "Values": [zone_id]})
        subnets = self._ec2("DescribeSubnets", region, lambda: ec2.describe_subnets(Filters=filters))
        return _Subnets(vpc_id=vpc_id, default_vpc=default, key="vpc_ids", subnets=subnets["Subnets"])

    def _pick(
        self, region: str, zone_id: str, subnets: list[dict[str, Any]], *, default_vpc: bool, key: str
    ) -> Network:
        fitting = [s for s in subnets if not zone_id or s.get("AvailabilityZoneId") == zone_id]
        if not fitting:
            where = f"zone {zone_id} of {region}" if zone_id else region
            raise NoCapacity(
                f"no subnet in {where} for the aws account (config key {key!r})",
                code="NoSubnetInZone",
                scope=Scope.ZONE,
                retry_after=600.0,
            )
        best = max(
            fitting, key=lambda s: (bool(s.get("DefaultForAz")) and default_vpc, s.get("AvailableIpAddressCount", 0))
        )
        return Network(vpc_id=str(best["VpcId"]), subnet_id=str(best["SubnetId"]))

    def _default_vpc(self, region: str) -> str:
        ec2 = client(self.auth, "ec2", region)
        vpcs = self._ec2(
            "DescribeVpcs", region, lambda: ec2.describe_vpcs(Filters=[{"Name": "isDefault", "Values": ["true"]}])
        )["Vpcs"]
        if not vpcs:
            raise InvalidConfig(
                f"{region} has no default VPC; set the aws account's config key 'subnets' (or 'vpc_ids') for {region}",
                code="NoDefaultVpc",
                scope=Scope.REGION,
            )
        return str(vpcs[0]["VpcId"])

    def _security_group(self, region: str, vpc_id: str) -> str:
        """The installation's group in this VPC: found by tag, else created
        (no ingress; EC2's default allow-all egress) and kept."""
        ec2 = client(self.auth, "ec2", region)
        found = self._find_group(ec2, region, vpc_id)
        if found:
            return found
        name = f"trainyard-{self.installation}"[:255]
        tags = [{"Key": INSTALLATION_TAG, "Value": self.installation}, {"Key": SG_TAG, "Value": SG_ROLE}]
        try:
            return str(
                ec2.create_security_group(
                    GroupName=name,
                    Description="Trainyard runners: no inbound traffic; they dial out to the server",
                    VpcId=vpc_id,
                    TagSpecifications=[
                        {"ResourceType": "security-group", "Tags": [*tags, {"Key": "Name", "Value": name}]}
                    ],
                )["GroupId"]
            )
        except ClientError as exc:
            if error_code(exc) != "InvalidGroup.Duplicate":
                raise compute_error(exc, action="CreateSecurityGroup", region=region) from exc
        # Another worker created it meanwhile.
        groups = self._ec2(
            "DescribeSecurityGroups",
            region,
            lambda: ec2.describe_security_groups(
                Filters=[{"Name": "vpc-id", "Values": [vpc_id]}, {"Name": "group-name", "Values": [name]}]
            ),
        )["SecurityGroups"]
        return str(groups[0]["GroupId"])

    def _find_group(self, ec2: Any, region: str, vpc_id: str) -> str:
        groups = self._ec2(
            "DescribeSecurityGroups",
            region,
            lambda: ec2.describe_security_groups(
                Filters=[
                    {"Name": "vpc-id", "Values": [vpc_id]},
                    {"Name": f"tag:{INSTALLATION_TAG}", "Values": [self.installation]},
                    {"Name": f"tag:{SG_TAG}", "Values": [SG_ROLE]},
                ]
            ),
        )["SecurityGroups"]
        return str(groups[0]["GroupId"]) if groups else ""

    def _zones(self, region: str) -> dict[str, str]:
        ec2 = client(self.auth, "ec2", region)
        zones = self._ec2("DescribeAvailabilityZones", region, ec2.describe_availability_zones)["AvailabilityZones"]
        return {str(z["ZoneId"]): str(z["ZoneName"]) for z in zones}

    def _ec2(self, action: str, region: str, call: Callable[[], Any]) -> Any:
        try:
            return call()
        except (ClientError, BotoCoreError) as exc:
            raise compute_error(exc, action=action, region=region) from exc


def _image_kind(gpu: bool) -> str:
    return "gpu" if gpu else "cpu"


def _noting(errors: list[str], what: str, find: Callable[[], T]) -> T | None:
    """``find()``, or None with the error noted (discovery is best effort)."""
    try:
        return find()
    except ComputeError as error:
        errors.append(f"{what}: {error}")
        return None
