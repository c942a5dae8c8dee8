"""EC2 and STS errors as the typed errors of ``backends/errors.py``.

One function, ``compute_error``, maps every botocore failure; the table it
follows is in docs/BACKENDS.md ("The aws backend: errors"). Messages say what the user can do and never
carry credentials: an error's own message is kept only after cutting
``UnauthorizedOperation``'s encoded authorization message, which is long and
unreadable.
"""

from __future__ import annotations

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    ConnectionClosedError,
    ConnectTimeoutError,
    EndpointConnectionError,
    NoCredentialsError,
    PartialCredentialsError,
    ReadTimeoutError,
)

from backend.clouds.backends.errors import (
    AuthFailed,
    ComputeError,
    InvalidConfig,
    NoCapacity,
    QuotaExceeded,
    Scope,
    Transient,
)

CAPACITY_SECONDS = 180.0
QUOTA_SECONDS = 600.0
SPOT_PRICE_SECONDS = 600.0  # "until prices refresh": the facts are refreshed about every 10 minutes
UNSUPPORTED_SECONDS = 24 * 3600.0
BAD_PARAMETER_SECONDS = 3600.0

CAPACITY = frozenset({"InsufficientInstanceCapacity", "InsufficientCapacity", "InsufficientHostCapacity"})
QUOTA = frozenset({"VcpuLimitExceeded", "InstanceLimitExceeded", "MaxSpotInstanceCountExceeded"})
UNSUPPORTED = frozenset({"Unsupported", "UnsupportedOperation"})
BAD_PARAMETER = frozenset({"InvalidParameterCombination", "InvalidParameterValue", "InvalidParameter"})
AUTH = frozenset(
    {
        "UnauthorizedOperation",
        "AuthFailure",
        "Blocked",
        "PendingVerification",
        "AccessDenied",
        "AccessDeniedException",
        "InvalidClientTokenId",
        "UnrecognizedClientException",
        "SignatureDoesNotMatch",
        "ExpiredToken",
        "ExpiredTokenException",
        "RequestExpired",
    }
)
THROTTLED = frozenset(
    {
        "RequestLimitExceeded",
        "Throttling",
        "ThrottlingException",
        "InternalError",
        "InternalFailure",
        "Unavailable",
        "ServiceUnavailable",
        "RequestTimeout",
    }
)
# Cached ids the launch drops and looks up again once (then: InvalidConfig).
STALE_ID_PREFIXES = ("InvalidAMIID.", "InvalidSubnetID.", "InvalidSubnet.", "InvalidGroup.NotFound")

# Quota families: instance-type prefix → (the family's name in the Service
# Quotas console, on-demand quota code, spot quota code).
STANDARD = ("Standard (A, C, D, H, I, M, R, T, Z)", "L-1216C47A", "L-34B43A08")
QUOTA_FAMILIES: dict[str, tuple[str, str, str]] = {
    "g": ("G and VT", "L-DB2E81BA", "L-3819A6DF"),
    "vt": ("G and VT", "L-DB2E81BA", "L-3819A6DF"),
    "p": ("P", "L-417A185B", "L-7212CCBC"),
    # Codes left empty: not verified; the message names the family only.
    "f": ("F", "", ""),
    "inf": ("Inf", "", ""),
    "trn": ("Trn", "", ""),
    "x": ("X", "", ""),
    "dl": ("DL", "", ""),
}


def compute_error(
    exc: ClientError | BotoCoreError,
    *,
    action: str,
    region: str,
    instance_type: str = "",
    spot: bool = False,
) -> ComputeError:
    """The typed error for a failed call of ``action`` (an EC2/STS API name,
    ``RunInstances``) in ``region``; ``instance_type`` and ``spot`` name the
    offer of a launch, so quota errors can name the quota."""
    if isinstance(exc, ClientError):
        return _client_error(exc, action=action, region=region, instance_type=instance_type, spot=spot)
    return _botocore_error(exc, action=action, region=region)


def error_code(exc: BaseException) -> str:
    """The AWS error code of a ``ClientError`` ("" for anything else)."""
    if isinstance(exc, ClientError):
        return str(exc.response.get("Error", {}).get("Code", ""))
    return ""


def is_stale_id(exc: BaseException) -> bool:
    """A cached AMI, subnet or security group the cloud no longer knows."""
    return error_code(exc).startswith(STALE_ID_PREFIXES)


def quota_family(instance_type: str) -> tuple[str, str, str]:
    """(family name, on-demand quota code, spot quota code) of ``instance_type``."""
    prefix = "".join(c for c in instance_type.split(".")[0] if c.isalpha()).lower()
    for length in (3, 2, 1):
        if prefix[:length] in QUOTA_FAMILIES:
            return QUOTA_FAMILIES[prefix[:length]]
    return STANDARD


def quota_key(instance_type: str) -> str:
    """The quota family as an offer names it (``Offer.data["quota_family"]``,
    which the offer blocks key on): ``standard`` for c6i, m7i, t3 and every
    other type one vCPU quota covers, ``g-and-vt``, ``p``, …"""
    family = quota_family(instance_type)[0]
    return "standard" if family == STANDARD[0] else family.lower().replace(" ", "-")


def quota_name(instance_type: str, region: str, *, spot: bool) -> str:
    """``the account's vCPU quota for G and VT instances in us-east-1 (On-Demand), quota code L-DB2E81BA``."""
    family, on_demand_code, spot_code = quota_family(instance_type)
    market, code = ("Spot", spot_code) if spot else ("On-Demand", on_demand_code)
    name = f"the account's vCPU quota for {family} instances in {region} ({market})"
    return f"{name}, quota code {code}" if code else name


def _client_error(exc: ClientError, *, action: str, region: str, instance_type: str, spot: bool) -> ComputeError:
    code = error_code(exc) or "Unknown"
    said = _aws_message(exc)
    what = f"{instance_type} ({'spot' if spot else 'on-demand'}) in {region}" if instance_type else region
    if code in CAPACITY:
        return NoCapacity(
            f"AWS has no capacity for {what} right now; trying other offers", code=code, scope=Scope.OFFER
        )
    if code == "InsufficientFreeAddressesInSubnet":
        return NoCapacity(
            f"the subnet has no free IP addresses for {what}; configure more subnets (config key 'subnets')",
            code=code,
            scope=Scope.ZONE,
        )
    if code == "SpotMaxPriceTooLow":
        return NoCapacity(
            f"the spot price of {what} is above the maximum price", code=code, retry_after=SPOT_PRICE_SECONDS
        )
    if code in QUOTA:
        return QuotaExceeded(_quota_message(code, instance_type, region, spot=spot, said=said), code=code)
    if code in UNSUPPORTED:
        return NoCapacity(
            f"{what} is not supported there: {said}",
            code=code,
            scope=Scope.INSTANCE_TYPE,
            retry_after=UNSUPPORTED_SECONDS,
        )
    if code in BAD_PARAMETER:
        return NoCapacity(
            f"EC2 refused the {action} parameters for {what} (a Trainyard bug; please report it): {said}",
            code=code,
            scope=Scope.INSTANCE_TYPE,
            retry_after=BAD_PARAMETER_SECONDS,
        )
    if code.startswith(STALE_ID_PREFIXES):
        return InvalidConfig(
            f"{action} in {region}: {said}; check the config keys 'amis', 'gpu_amis' and 'subnets' for {region}",
            code=code,
            scope=Scope.REGION,
        )
    if code == "OptInRequired":
        return AuthFailed(
            f"the account has not enabled region {region} (or the service) for {action}; "
            "enable it in the AWS console or remove the region from the account's 'regions'",
            code=code,
            scope=Scope.REGION,
        )
    if code in AUTH:
        return AuthFailed(_auth_message(code, action, region), code=code)
    if code in THROTTLED or _status(exc) >= 500:
        return Transient(f"AWS answered {code} to {action} in {region}; trying again", code=code)
    if code == "IdempotentParameterMismatch":
        # A bug of ours (the token must be unique per launch attempt): neither retried nor the next offer.
        return ComputeError(f"{action} in {region} reused a client token with other parameters: {said}", code=code)
    return Transient(f"{action} in {region} failed: {said}", code=code, retry_after=30.0)


def _botocore_error(exc: BotoCoreError, *, action: str, region: str) -> ComputeError:
    if isinstance(exc, NoCredentialsError | PartialCredentialsError):
        return AuthFailed(
            f"the server has no usable AWS credentials to call {action} in {region}", code=type(exc).__name__
        )
    if isinstance(exc, EndpointConnectionError | ConnectTimeoutError | ReadTimeoutError | ConnectionClosedError):
        return Transient(f"AWS did not answer {action} in {region} in time; trying again", code=type(exc).__name__)
    return Transient(f"{action} in {region} failed: {type(exc).__name__}", code=type(exc).__name__)


def _quota_message(code: str, instance_type: str, region: str, *, spot: bool, said: str) -> str:
    if code == "InstanceLimitExceeded" and not instance_type:
        return f"the account's instance limit in {region} is reached: {said}"
    quota = quota_name(instance_type or "m", region, spot=spot or code == "MaxSpotInstanceCountExceeded")
    return (
        f"{quota} does not allow {instance_type or 'this machine'}; "
        "ask AWS for more in the Service Quotas console (EC2), or allow other instance families"
    )


def _auth_message(code: str, action: str, region: str) -> str:
    service = "sts" if action in ("AssumeRole", "GetCallerIdentity") else "ec2"
    if code in ("UnauthorizedOperation", "AccessDenied", "AccessDeniedException"):
        return (
            f"the account's credentials may not call {service}:{action} in {region}; "
            "add the permission to the role's policy (docs/BACKENDS.md lists the actions Trainyard needs)"
        )
    if code in ("Blocked", "PendingVerification"):
        return f"AWS does not let the account call {service}:{action} in {region} yet ({code}); see the AWS console"
    return f"AWS refused the account's credentials for {service}:{action} in {region} ({code}); reconnect the account"


def _aws_message(exc: ClientError) -> str:
    message = str(exc.response.get("Error", {}).get("Message", "")) or "no message"
    return message.split(" Encoded authorization failure message:")[0][:500]


def _status(exc: ClientError) -> int:
    status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
    return int(status) if isinstance(status, int) else 0
