"""The ``aws`` backend: EC2 on-demand and spot machines in the user's own account.

The contract's mapping (docs/BACKENDS.md, "The aws backend"):

- ``offers``: the shipped catalog (``catalog.py``) for the configured
  regions, split per zone by the account facts in ``config["facts"]``
  (``facts.py``), which ``refresh_facts`` fetches; no AWS call.
- ``launch``: adopt a live instance tagged with the key, else one
  RunInstances with ``ClientToken`` = the key (``launch.py``).
- ``describe``: batched DescribeInstances per region; an id unknown within
  5 minutes of its launch is PENDING (not visible yet).
- ``terminate``: TerminateInstances; gone or unknown is success;
  NotYetTerminated until EC2 says ``terminated``.
- ``list_managed``: instances tagged with this installation and account.

Config keys: ``options.py``. Errors: ``errors.compute_error``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from botocore.exceptions import BotoCoreError, ClientError

from backend.clouds.backends.aws.catalog import CATALOG_DATE, GIB, GP3_GIB_MONTH, CatalogRow, by_key, load_catalog
from backend.clouds.backends.aws.errors import STALE_ID_PREFIXES, compute_error, error_code, quota_key
from backend.clouds.backends.aws.facts import SPOT_PRICE_MAX_AGE, AccountFacts, RegionFacts, fetch_facts
from backend.clouds.backends.aws.identity import identity_verify, trusted_certificates
from backend.clouds.backends.aws.launch import Launcher
from backend.clouds.backends.aws.machines import (
    ACCOUNT_TAG,
    INSTALLATION_TAG,
    KEY_TAG,
    LIVE_STATES,
    NOT_VISIBLE_GRACE,
    cloud_state,
    handle_of,
    launched_at,
    tags_of,
)
from backend.clouds.backends.aws.machines import machine_tags as _machine_tags
from backend.clouds.backends.aws.options import AwsOptions
from backend.clouds.backends.aws.session import auth_of, client, warm
from backend.clouds.backends.aws.volumes import EbsVolumes
from backend.clouds.backends.base import (
    AccountConfig,
    CloudState,
    Compute,
    Handle,
    LaunchSpec,
    MachineIdentity,
    Offer,
    Requirements,
    Timings,
    VolumeInfo,
    VolumeSpec,
    in_placement,
)
from backend.clouds.backends.errors import ComputeError, InvalidConfig, NoCapacity, NotYetTerminated

MAX_TOKEN = 64  # EC2's ClientToken limit
CPU_DISK_GIB = 100
GPU_DISK_GIB = 200  # CUDA images, datasets and checkpoints
PROVISION_TIMEOUT = 600.0
PROVISION_TIMEOUT_8_GPUS = 1500.0  # 8-GPU types take far longer (dstack #2342: 25 min for 8 H100s)
DESCRIBE_BATCH = 200
NOT_FOUND_CODES = ("InvalidInstanceID.NotFound", "InvalidInstanceID.Malformed")


class AwsCompute(Compute):
    kind = "aws"
    reusable_instances = True
    supports_spot = True
    boots_from_image = True  # machines run LaunchSpec.user_data at first boot
    signs_identity = True  # the instance identity document (identity.py)
    timings = Timings(provision_timeout=PROVISION_TIMEOUT, unreachable_grace=120.0, idle_default=300.0)
    catalog_date = CATALOG_DATE
    volume_kind = "ebs"  # volumes.py

    def __init__(self, account: AccountConfig) -> None:
        super().__init__(account)
        self.options = AwsOptions.of(account)
        self.auth = auth_of(account)
        self.catalog = tuple(r for r in load_catalog(self.options.catalog_file) if r.region in self.options.regions)
        missing = sorted(set(self.options.regions) - {row.region for row in self.catalog})
        if missing:
            raise InvalidConfig(
                f"the aws catalog (dated {CATALOG_DATE}) has no instance types in {', '.join(missing)}; "
                "remove the region from 'regions' or point 'catalog_file' at a catalog that has it",
                code="RegionNotInCatalog",
            )
        self.rows = by_key(self.catalog)
        self.facts = AccountFacts.from_json(account.config.get("facts"))
        self.launcher = Launcher(self.auth, self.options, account.installation, self.facts)
        self.ebs = EbsVolumes(
            self.auth, installation=account.installation, account_id=account.account_id, regions=self.options.regions
        )

    @classmethod
    def identity_of(cls, *, document: str, signature: str, trusted_pem: str) -> MachineIdentity:
        return identity_verify(document=document, signature=signature, trusted=trusted_certificates(trusted_pem))

    @classmethod
    def cloud_account_of(cls, config: Mapping[str, object]) -> str:
        return str(config.get("aws_account_id") or "")

    @classmethod
    def warm(cls) -> None:
        """botocore's models of EC2, S3, STS and Service Quotas, read into the
        loader every session shares (``session.warm``)."""
        warm()

    def provision_timeout_for(self, offer: Offer) -> float:
        """Launch → the runner's hello for ``offer``: 10 min, 25 for 8-GPU types."""
        return PROVISION_TIMEOUT_8_GPUS if len(offer.gpus) >= 8 else PROVISION_TIMEOUT

    def refresh_facts(self) -> dict[str, object]:
        """Ask the account for its zones, offerings, spot prices and quotas,
        and for the ids a launch needs (several AWS calls per region), as
        ``AccountFacts.to_json()``; the services store it as
        ``config["facts"]``, and ``offers`` and ``launch`` of a backend built
        on it use them."""
        return self.fetch_facts().to_json()

    def fetch_facts(self) -> AccountFacts:
        """``refresh_facts`` as an ``AccountFacts``."""
        facts = fetch_facts(self.auth, self.options.regions, self.catalog)
        regions: dict[str, RegionFacts] = {}
        errors = list(facts.errors)
        for name, region in facts.regions.items():
            launch, failed = self.launcher.discover(name, region.zones)
            regions[name] = dataclasses.replace(region, launch=launch)
            errors.extend(failed)
        return dataclasses.replace(facts, regions=regions, errors=tuple(errors))

    def offers(self, req: Requirements) -> Iterable[Offer]:
        """Catalog rows of the configured regions; per zone where the facts
        say the type is offered (a type they do not list is not offered),
        else one per region with zone "". Spot rows carry the account's
        recent spot price when the facts have a sane one, else the catalog's
        estimate. Root disk: the row's disk_size, else 100 GiB (200 with
        GPUs) or the requirement's disk, whichever is larger."""
        facts = self.facts
        spot_prices_fresh = facts is not None and time.time() - facts.refreshed_at < SPOT_PRICE_MAX_AGE.total_seconds()
        found = []
        for row in self.catalog:
            region = facts.regions.get(row.region) if facts else None
            for offer in _row_offers(self.kind, row, region, req, spot_prices=spot_prices_fresh):
                if in_placement(req, offer):
                    found.append(offer)
        return found

    def launch(self, offer: Offer, spec: LaunchSpec) -> Handle:
        """1. A live instance tagged ``trainyard:key`` = the key is adopted.
        2. Else RunInstances (``ClientToken`` = the key) with every tag on
        the instance, its volume and its network interface; IMDSv2 only;
        shutdown terminates; gp3 root volume; spot one-time.
        3. A cached AMI, subnet or group EC2 no longer knows is dropped and
        the launch tried once more."""
        key = spec.idempotency_key
        if not key or len(key) > MAX_TOKEN:
            raise ComputeError(f"idempotency key {key!r} cannot be a ClientToken (1–64 chars)", code="BadKey")
        row = self.rows.get((offer.region, offer.instance_type, offer.spot))
        if row is None:
            raise NoCapacity(
                f"the aws catalog has no {offer.instance_type} ({'spot' if offer.spot else 'on-demand'}) "
                f"in the account's regions ({', '.join(self.options.regions)})",
                code="UnknownOffer",
            )
        for found in self._find(offer.region, {key}, LIVE_STATES):
            return found
        tags = _machine_tags(self.account, spec)
        for attempt in range(2):
            try:
                params = self.launcher.params(
                    offer, gpu=bool(row.gpus), token=key, tags=tags, user_data=spec.user_data, facts=self.facts
                )
                answer = self.launcher.run(offer, params)
                return handle_of(answer["Instances"][0], offer.region, key=key)
            except ComputeError as error:
                if attempt or not error.code.startswith(STALE_ID_PREFIXES):
                    raise
                self.launcher.forget(offer.region)
        raise AssertionError("unreachable")

    def describe(self, handles: Sequence[Handle]) -> Mapping[str, CloudState]:
        """One DescribeInstances per region for the handles with an id (per
        id only when the batch names an unknown id), one by tag for those
        without."""
        states: dict[str, CloudState] = {}
        by_region: dict[str, list[Handle]] = {}
        for handle in handles:
            if handle.backend_id:
                by_region.setdefault(handle.region or self.options.regions[0], []).append(handle)
        for region, group in by_region.items():
            known = self._by_id(region, [h.backend_id for h in group])
            for handle in group:
                instance = known.get(handle.backend_id)
                states[handle.key] = cloud_state(instance) if instance else _unknown_state(handle)
        keyless = {h.key for h in handles if not h.backend_id}
        if keyless:
            for region in self.options.regions:
                going = (*LIVE_STATES, "shutting-down")
                for instance in self._instances(region, tags={KEY_TAG: sorted(keyless)}, states=going):
                    states[tags_of(instance)[KEY_TAG]] = cloud_state(instance)
        return {h.key: states.get(h.key, CloudState.NOT_FOUND) for h in handles}

    def terminate(self, handle: Handle) -> None:
        """Done when EC2 says ``terminated`` or knows no such id (unless the
        launch was under 5 minutes ago: not visible yet). ``NotYetTerminated``
        while it shuts down. A handle without an id terminates what carries its key."""
        if not handle.backend_id:
            targets = [f for region in self.options.regions for f in self._find(region, {handle.key}, LIVE_STATES)]
        else:
            targets = [handle]
        for target in targets:
            self._terminate(target)

    def list_managed(self) -> Sequence[Handle]:
        """Live instances tagged with this installation and this account, in every configured region."""
        found: list[Handle] = []
        for region in self.options.regions:
            tags = {INSTALLATION_TAG: self.account.installation, ACCOUNT_TAG: self.account.account_id}
            for instance in self._instances(region, tags=tags, states=LIVE_STATES):
                found.append(handle_of(instance, region, key=tags_of(instance).get(KEY_TAG, instance["InstanceId"])))
        return found

    def volume_create(self, spec: VolumeSpec) -> VolumeInfo:
        """An EBS gp3 volume in ``spec.zone`` (else the region's first zone), tagged with ``spec.key``."""
        return self.ebs.create(spec, self.facts)

    def volume_attach(self, volume: VolumeInfo, machine: Handle) -> str:
        return self.ebs.attach(volume, machine)

    def volume_detach(self, volume: VolumeInfo, machine: Handle) -> None:
        self.ebs.detach(volume, machine)

    def volume_delete(self, volume: VolumeInfo) -> None:
        self.ebs.delete(volume)

    def volume_describe(self, volumes: Sequence[VolumeInfo]) -> Mapping[str, VolumeInfo]:
        return self.ebs.describe(volumes)

    def volumes_managed(self) -> Sequence[VolumeInfo]:
        return self.ebs.managed()

    # ------------------------------------------------------------------ helpers

    def _terminate(self, handle: Handle) -> None:
        region = handle.region or self.options.regions[0]
        instance = self._by_id(region, [handle.backend_id]).get(handle.backend_id)
        if instance is None:
            if _unknown_state(handle) is CloudState.PENDING:
                raise NotYetTerminated(
                    f"{handle.backend_id} is not visible yet; terminating it later", retry_after=10.0
                )
            return
        if instance["State"]["Name"] == "terminated":
            return
        # Asked again while shutting-down too: EC2 accepts it and answers the current state.
        try:
            answer = client(self.auth, "ec2", region).terminate_instances(InstanceIds=[handle.backend_id])
        except (ClientError, BotoCoreError) as exc:
            if error_code(exc) in NOT_FOUND_CODES:
                return
            raise compute_error(exc, action="TerminateInstances", region=region) from exc
        if answer["TerminatingInstances"][0]["CurrentState"]["Name"] != "terminated":
            raise NotYetTerminated(f"{handle.backend_id} is shutting down", retry_after=5.0)

    def _by_id(self, region: str, ids: Sequence[str]) -> dict[str, dict[str, Any]]:
        """Instances by id; ids EC2 does not know are left out."""
        found: dict[str, dict[str, Any]] = {}
        for start in range(0, len(ids), DESCRIBE_BATCH):
            batch = list(ids[start : start + DESCRIBE_BATCH])
            try:
                found.update({i["InstanceId"]: i for i in self._instances(region, ids=batch)})
            except _NotFound:
                for one in batch:  # the batch named an unknown id: ask for each
                    with contextlib.suppress(_NotFound):
                        found.update({i["InstanceId"]: i for i in self._instances(region, ids=[one])})
        return found

    def _find(self, region: str, keys: set[str], states: Sequence[str]) -> list[Handle]:
        instances = self._instances(region, tags={KEY_TAG: sorted(keys)}, states=states)
        ordered = sorted(instances, key=lambda i: str(i.get("LaunchTime", "")))
        return [handle_of(instance, region, key=tags_of(instance)[KEY_TAG]) for instance in ordered]

    def _instances(
        self,
        region: str,
        *,
        ids: Sequence[str] = (),
        tags: Mapping[str, str | Sequence[str]] | None = None,
        states: Sequence[str] = (),
    ) -> Iterator[dict[str, Any]]:
        filters = [
            {"Name": f"tag:{name}", "Values": [value] if isinstance(value, str) else list(value)}
            for name, value in (tags or {}).items()
        ]
        if states:
            filters.append({"Name": "instance-state-name", "Values": list(states)})
        kwargs: dict[str, Any] = {"Filters": filters} if filters else {}
        if ids:
            kwargs["InstanceIds"] = list(ids)
        try:
            pages = list(client(self.auth, "ec2", region).get_paginator("describe_instances").paginate(**kwargs))
        except (ClientError, BotoCoreError) as exc:
            if error_code(exc) in NOT_FOUND_CODES:
                raise _NotFound from exc
            raise compute_error(exc, action="DescribeInstances", region=region) from exc
        for page in pages:
            for reservation in page["Reservations"]:
                yield from reservation["Instances"]


class _NotFound(Exception):
    """DescribeInstances named an id EC2 does not know."""


def _unknown_state(handle: Handle) -> CloudState:
    """An id EC2 does not know: not visible yet within 5 minutes of its launch."""
    at = launched_at(handle)
    return CloudState.PENDING if at is not None and time.time() - at < NOT_VISIBLE_GRACE else CloudState.NOT_FOUND


def _row_offers(
    kind: str, row: CatalogRow, region: RegionFacts | None, req: Requirements, *, spot_prices: bool
) -> list[Offer]:
    disk_gib = row.disk_gib or max(GPU_DISK_GIB if row.gpus else CPU_DISK_GIB, -(-(req.disk_bytes or 0) // GIB))
    # quota_family: one vCPU quota covers many type prefixes (c6i, m7i, t3:
    # Standard), so a quota error blocks them all, not just the prefix.
    data = {
        "catalog_date": CATALOG_DATE,
        "flags": " ".join(row.flags),
        "quota_family": quota_key(row.instance_type),
        # Every machine boots from a gp3 root volume of the offer's disk size (launch.py).
        "root_volume_gib_month": GP3_GIB_MONTH,
    }

    def offer(zone: str, zone_name: str, price: float, source: str) -> Offer:
        return Offer(
            backend=kind,
            instance_type=row.instance_type,
            region=row.region,
            zone=zone,
            spot=row.spot,
            price_per_hour=price,
            cpus=row.cpus,
            memory_bytes=row.memory_bytes,
            disk_bytes=disk_gib * GIB,
            gpus=row.gpus,
            data={**data, "zone_name": zone_name, "price_source": source},
        )

    if region is None:
        return [offer("", "", row.price_per_hour, "catalog")]
    prices = region.spot_prices.get(row.instance_type, {}) if row.spot and spot_prices else {}
    return [
        offer(
            zone,
            region.zone_name(zone),
            prices.get(zone, row.price_per_hour),
            "spot-history" if zone in prices else "catalog",
        )
        for zone in region.offerings.get(row.instance_type, ())
    ]
