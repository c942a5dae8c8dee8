"""Account facts: what the catalog cannot know about one AWS account.

``fetch_facts`` asks the account, per configured region, for its zones
(DescribeAvailabilityZones: zone ID → the account's zone name), which
catalog types it offers in which zone (DescribeInstanceTypeOfferings,
LocationType ``availability-zone-id``: zones are keyed by ID, because zone
names are per-account aliases), recent spot prices (DescribeSpotPriceHistory)
and, best effort, its vCPU quotas (Service Quotas). ``AccountFacts.to_json``
is a plain JSON-able dict; the services store it and hand it back as
``AccountConfig.config["facts"]``, where ``AwsCompute.offers`` reads it with
``AccountFacts.from_json``: ``offers`` never calls AWS itself.

The format (``version`` 1)::

    {"version": 1, "refreshed_at": 1764580000.0,        # epoch seconds
     "errors": ["eu-west-1: AuthFailed: …"],            # what could not be read
     "regions": {"us-east-1": {
         "zones": {"use1-az1": "us-east-1b", …},         # zone ID → zone name
         "offerings": {"g5.xlarge": ["use1-az1", …], …}, # type → zone IDs
         "spot_prices": {"g5.xlarge": {"use1-az1": 0.41}},  # sane prices only
         "quotas": {"L-DB2E81BA": 64.0},                 # vCPUs; absent = unknown
         "launch": {"basis": "9c1d…",                    # the config the ids were found for
                    "images": {"cpu": {"image_id": "ami-…", "root_device": "/dev/sda1", "min_gib": 8}},
                    "networks": {"use1-az1": {"vpc_id": "vpc-…", "subnet_id": "subnet-…"}},  # zone ID →
                    "security_groups": {"vpc-…": "sg-…"}}}}}

``launch`` holds what ``launch.Launcher.discover`` found for RunInstances
(the image, the subnet per zone, the installation's security group when it
exists), so that a launch from a new process asks EC2 for none of them. It
is used only while its ``basis`` matches the account's config, and an id
EC2 no longer knows is dropped at launch and looked up again.

A region missing from ``regions`` (it failed, or facts were never fetched)
gets one offer per catalog row with zone "" (EC2 picks the zone at launch).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from backend.clouds.backends.aws.catalog import CatalogRow
from backend.clouds.backends.aws.errors import compute_error, quota_family
from backend.clouds.backends.aws.session import AwsAuth, client
from backend.clouds.backends.errors import AuthFailed, ComputeError, Scope

logger = logging.getLogger(__name__)

FACTS_VERSION = 1
SPOT_PRICE_MAX_AGE = timedelta(days=1)
# A spot price below 1% of on-demand (moto's 0.00001) or above 1.5 times it is not a price.
SPOT_PRICE_MIN_FRACTION = 0.01
SPOT_PRICE_MAX_FRACTION = 1.5
FILTER_VALUES = 100  # instance types per filter value list


@dataclass(frozen=True)
class Image:
    image_id: str
    root_device: str
    min_gib: int  # the root snapshot's size: the volume may not be smaller


@dataclass(frozen=True)
class Network:
    vpc_id: str
    subnet_id: str  # "" in a default VPC with no zone: EC2 picks


@dataclass(frozen=True)
class LaunchFacts:
    """The ids RunInstances needs in one region, found for the config ``basis``."""

    basis: str
    images: Mapping[str, Image] = field(default_factory=dict)  # "cpu" / "gpu" → image
    networks: Mapping[str, Network] = field(default_factory=dict)  # zone ID → network
    security_groups: Mapping[str, str] = field(default_factory=dict)  # VPC id → group id

    def to_json(self) -> dict[str, object]:
        return {
            "basis": self.basis,
            "images": {k: dataclasses.asdict(image) for k, image in self.images.items()},
            "networks": {zone: dataclasses.asdict(network) for zone, network in self.networks.items()},
            "security_groups": dict(self.security_groups),
        }

    @classmethod
    def from_json(cls, raw: Mapping[str, Any]) -> LaunchFacts:
        images = {
            str(k): Image(str(v["image_id"]), str(v["root_device"]), int(v["min_gib"]))
            for k, v in raw["images"].items()
        }
        networks = {str(k): Network(str(v["vpc_id"]), str(v["subnet_id"])) for k, v in raw["networks"].items()}
        groups = {str(k): str(v) for k, v in raw["security_groups"].items()}
        return cls(basis=str(raw["basis"]), images=images, networks=networks, security_groups=groups)


@dataclass(frozen=True)
class RegionFacts:
    zones: Mapping[str, str] = field(default_factory=dict)  # zone ID → zone name
    offerings: Mapping[str, tuple[str, ...]] = field(default_factory=dict)  # type → zone IDs
    spot_prices: Mapping[str, Mapping[str, float]] = field(default_factory=dict)  # type → zone ID → $/h
    quotas: Mapping[str, float] = field(default_factory=dict)  # quota code → vCPUs
    launch: LaunchFacts | None = None

    def zone_name(self, zone_id: str) -> str:
        return self.zones.get(zone_id, "")


@dataclass(frozen=True)
class AccountFacts:
    refreshed_at: float
    regions: Mapping[str, RegionFacts] = field(default_factory=dict)
    errors: tuple[str, ...] = ()

    def to_json(self) -> dict[str, object]:
        return {
            "version": FACTS_VERSION,
            "refreshed_at": self.refreshed_at,
            "errors": list(self.errors),
            "regions": {
                name: {
                    "zones": dict(region.zones),
                    "offerings": {t: list(zones) for t, zones in region.offerings.items()},
                    "spot_prices": {t: dict(prices) for t, prices in region.spot_prices.items()},
                    "quotas": dict(region.quotas),
                    **({"launch": region.launch.to_json()} if region.launch else {}),
                }
                for name, region in self.regions.items()
            },
        }

    @classmethod
    def from_json(cls, raw: object) -> AccountFacts | None:
        """The facts in ``raw``; None when absent, of another version or
        malformed (offers then work from the catalog alone)."""
        if not isinstance(raw, Mapping) or raw.get("version") != FACTS_VERSION:
            return None
        try:
            regions = {str(name): _region_from_json(region) for name, region in dict(raw["regions"]).items()}
            return cls(
                refreshed_at=float(raw["refreshed_at"]),
                regions=regions,
                errors=tuple(str(e) for e in raw.get("errors", [])),
            )
        except (KeyError, TypeError, ValueError, AttributeError):
            logger.warning("ignoring malformed aws account facts")
            return None


def fetch_facts(auth: AwsAuth, regions: Sequence[str], catalog: Sequence[CatalogRow]) -> AccountFacts:
    """Ask the account (see the module docstring). A region that fails is
    left out and named in ``errors``; spot prices and quotas are best
    effort. Raises ``AuthFailed`` only when the credentials fail everywhere."""
    found: dict[str, RegionFacts] = {}
    errors: list[str] = []
    auth_errors: list[ComputeError] = []
    for region in regions:
        try:
            found[region] = _region_facts(auth, region, [row for row in catalog if row.region == region], errors)
        except ComputeError as error:
            errors.append(f"{region}: {error}")
            if isinstance(error, AuthFailed) and error.scope == Scope.ACCOUNT:
                auth_errors.append(error)
    if auth_errors and len(auth_errors) == len(regions):
        raise auth_errors[0]
    return AccountFacts(refreshed_at=time.time(), regions=found, errors=tuple(errors))


def sane_spot_price(price: float, on_demand: float, at: datetime, now: datetime) -> bool:
    """A real spot price: recent, and not absurdly low or high against on-demand."""
    if now - at > SPOT_PRICE_MAX_AGE:
        return False
    return on_demand * SPOT_PRICE_MIN_FRACTION <= price <= on_demand * SPOT_PRICE_MAX_FRACTION


def _region_facts(auth: AwsAuth, region: str, rows: Sequence[CatalogRow], errors: list[str]) -> RegionFacts:
    ec2 = client(auth, "ec2", region)
    zones = _call(
        "DescribeAvailabilityZones",
        region,
        lambda: {
            z["ZoneId"]: z["ZoneName"]
            for z in ec2.describe_availability_zones(AllAvailabilityZones=False)["AvailabilityZones"]
            if z.get("ZoneType", "availability-zone") == "availability-zone"
        },
    )
    types = sorted({row.instance_type for row in rows})
    offerings = _call("DescribeInstanceTypeOfferings", region, lambda: _offerings(ec2, types))
    spot_prices: Mapping[str, Mapping[str, float]] = {}
    try:
        spot_prices = _call("DescribeSpotPriceHistory", region, lambda: _spot_prices(ec2, rows, zones))
    except ComputeError as error:
        errors.append(f"{region} spot prices: {error}")
    return RegionFacts(
        zones=zones, offerings=offerings, spot_prices=spot_prices, quotas=_quotas(auth, region, types, errors)
    )


def _offerings(ec2: Any, types: Sequence[str]) -> dict[str, tuple[str, ...]]:
    found: dict[str, list[str]] = {}
    for chunk in _chunks(types, FILTER_VALUES):
        pages = ec2.get_paginator("describe_instance_type_offerings").paginate(
            LocationType="availability-zone-id", Filters=[{"Name": "instance-type", "Values": list(chunk)}]
        )
        for page in pages:
            for offering in page["InstanceTypeOfferings"]:
                found.setdefault(offering["InstanceType"], []).append(offering["Location"])
    return {t: tuple(sorted(zones)) for t, zones in found.items()}


def _spot_prices(ec2: Any, rows: Sequence[CatalogRow], zones: Mapping[str, str]) -> dict[str, dict[str, float]]:
    """The latest sane price per type and zone ID; absurd ones (moto's
    0.00001 dated 2006) are dropped, so the catalog's estimate stays."""
    on_demand = {row.instance_type: row.price_per_hour for row in rows if not row.spot}
    zone_ids = {name: zone_id for zone_id, name in zones.items()}
    now = datetime.now(UTC)
    latest: dict[tuple[str, str], tuple[datetime, float]] = {}
    for chunk in _chunks(sorted(on_demand), FILTER_VALUES):
        pages = ec2.get_paginator("describe_spot_price_history").paginate(
            InstanceTypes=list(chunk),
            ProductDescriptions=["Linux/UNIX", "Linux/UNIX (Amazon VPC)"],
            StartTime=now - timedelta(hours=1),
        )
        for page in pages:
            for item in page["SpotPriceHistory"]:
                zone_id = zone_ids.get(item.get("AvailabilityZone", ""), "")
                at, price, kind = item["Timestamp"], float(item["SpotPrice"]), item["InstanceType"]
                newer = (kind, zone_id) not in latest or latest[kind, zone_id][0] < at
                if zone_id and newer and sane_spot_price(price, on_demand.get(kind, 0.0), at, now):
                    latest[kind, zone_id] = (at, price)
    prices: dict[str, dict[str, float]] = {}
    for (kind, zone_id), (_, price) in latest.items():
        prices.setdefault(kind, {})[zone_id] = price
    return prices


def _quotas(auth: AwsAuth, region: str, types: Sequence[str], errors: list[str]) -> dict[str, float]:
    """vCPU quotas of the catalog's families, best effort (moto: NoSuchResourceException)."""
    codes = sorted({code for t in types for code in quota_family(t)[1:] if code})
    quotas = client(auth, "service-quotas", region)
    found: dict[str, float] = {}
    for code in codes:
        try:
            found[code] = float(quotas.get_service_quota(ServiceCode="ec2", QuotaCode=code)["Quota"]["Value"])
        except (ClientError, BotoCoreError, KeyError) as exc:
            errors.append(f"{region} quota {code}: {type(exc).__name__}")
            if isinstance(exc, ClientError) and exc.response.get("Error", {}).get("Code") == "NoSuchResourceException":
                break  # the service is not there at all: asking for the other codes says the same
    return found


def _call(action: str, region: str, call: Callable[[], Any]) -> Any:
    try:
        return call()
    except (ClientError, BotoCoreError) as exc:
        raise compute_error(exc, action=action, region=region) from exc


def _chunks(items: Sequence[str], size: int) -> Iterable[Sequence[str]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]


def _region_from_json(raw: Mapping[str, Any]) -> RegionFacts:
    return RegionFacts(
        launch=_launch_from_json(raw.get("launch")),
        zones={str(k): str(v) for k, v in dict(raw.get("zones", {})).items()},
        offerings={str(k): tuple(str(z) for z in v) for k, v in dict(raw.get("offerings", {})).items()},
        spot_prices={
            str(k): {str(z): float(p) for z, p in dict(v).items()} for k, v in dict(raw.get("spot_prices", {})).items()
        },
        quotas={str(k): float(v) for k, v in dict(raw.get("quotas", {})).items()},
    )


def _launch_from_json(raw: object) -> LaunchFacts | None:
    """None when absent or malformed: the launcher then looks the ids up itself."""
    if not isinstance(raw, Mapping):
        return None
    try:
        return LaunchFacts.from_json(raw)
    except (KeyError, TypeError, ValueError, AttributeError):
        logger.warning("ignoring malformed aws launch facts")
        return None
