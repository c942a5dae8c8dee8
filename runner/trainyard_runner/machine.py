"""What a runner on a cloud machine does for the machine's sake: keep the
token it got in exchange for the bootstrap one, say where it runs (instance
metadata), and power the machine off when it must not stay up.

A runner started by hand or by the local backend uses none of this unless
told to (``--cloud``, ``--power-off-after``, ``--max-lifetime``).
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

from .protocol import MAX_IDENTITY_CHARS, CloudIdentity

log = logging.getLogger(__name__)

TOKEN_FILE = "runner-token"  # in the work dir, mode 0600
FIRST_START_FILE = "first-start"  # unix time of the first start (--max-lifetime counts from it)
IMDS_DEFAULT = "http://169.254.169.254"
IMDS_TIMEOUT = 2.0
IMDS_TOKEN_TTL = 21600
POWER_OFF_TIMEOUT = 60.0
MAX_READ = MAX_IDENTITY_CHARS  # bytes of one metadata answer (the identity document's signature is the longest)


# ------------------------------------------------------------ the saved token


def saved_token(work_dir: Path) -> str:
    """The runner's own token, saved after the bootstrap exchange; "" if none."""
    try:
        return (work_dir / TOKEN_FILE).read_text().strip()
    except FileNotFoundError:
        return ""


def save_token(work_dir: Path, token: str) -> None:
    """Written whole or not at all (temp file, fsync, rename), readable by the owner only."""
    work_dir.mkdir(parents=True, exist_ok=True)
    tmp = work_dir / f".{TOKEN_FILE}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.write(fd, token.encode() + b"\n")
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, work_dir / TOKEN_FILE)


def first_start(work_dir: Path) -> float:
    """When a runner first started in ``work_dir`` (unix time), recorded on the first call."""
    path = work_dir / FIRST_START_FILE
    try:
        return float(path.read_text())
    except (FileNotFoundError, ValueError):
        now = time.time()
        work_dir.mkdir(parents=True, exist_ok=True)
        path.write_text(f"{now}\n")
        return now


# ---------------------------------------------------------- instance metadata


class Imds:
    """An IMDSv2 client: a session token first (``PUT /latest/api/token``,
    TTL ``IMDS_TOKEN_TTL``), refreshed a minute before it expires and asked
    for again when a read is answered 401; every read carries it. Never the
    unauthenticated v1. 2 s per HTTP call. Blocking (the watcher calls it in
    a thread). The address is ``endpoint``, else
    ``AWS_EC2_METADATA_SERVICE_ENDPOINT``, else the link-local default."""

    def __init__(self, endpoint: str = "", *, ttl: int = IMDS_TOKEN_TTL, timeout: float = IMDS_TIMEOUT) -> None:
        self.base = (endpoint or os.environ.get("AWS_EC2_METADATA_SERVICE_ENDPOINT") or IMDS_DEFAULT).rstrip("/")
        self._ttl = min(ttl, IMDS_TOKEN_TTL)
        self._timeout = timeout
        self._token = ""
        self._token_until = 0.0  # monotonic time after which it is asked for again

    def get(self, path: str, *, under: str = "meta-data") -> str | None:
        """``/latest/<under>/<path>`` (``meta-data``, or ``dynamic`` for the
        instance identity document); None when it is not there (404)."""
        url = f"{self.base}/latest/{under}/{path.lstrip('/')}"
        for fresh in (False, True):
            try:
                token = self._session(fresh)
                return _imds(url, headers={"X-aws-ec2-metadata-token": token}, timeout=self._timeout, limit=MAX_READ)
            except urllib.error.HTTPError as e:
                if e.code == 404:
                    return None
                if e.code != 401 or fresh:
                    raise
                log.info("instance metadata refused the session token (401): asking for a new one")
        raise AssertionError("unreachable")

    def _session(self, fresh: bool) -> str:
        if fresh or not self._token or time.monotonic() >= self._token_until:
            self._token = _imds(
                f"{self.base}/latest/api/token",
                method="PUT",
                headers={"X-aws-ec2-metadata-token-ttl-seconds": str(self._ttl)},
                timeout=self._timeout,
            )
            self._token_until = time.monotonic() + max(self._ttl - 60, self._ttl / 2)
        return self._token


def aws_identity(endpoint: str = "") -> CloudIdentity | None:
    """The EC2 instance this runs on, from IMDSv2 (``Imds``), with its
    instance identity document and that document's RSA-2048 signature, which
    the server checks (without them it refuses the hello). None when the
    metadata service does not answer within 2 s per call."""
    imds = Imds(endpoint)
    try:
        values = {
            key: imds.get(path, under=under) or ""
            for key, under, path in (
                ("instance_id", "meta-data", "instance-id"),
                ("instance_type", "meta-data", "instance-type"),
                ("region", "meta-data", "placement/region"),
                ("zone", "meta-data", "placement/availability-zone"),
                ("document", "dynamic", "instance-identity/document"),
                ("signature", "dynamic", "instance-identity/rsa2048"),
            )
        }
    except (OSError, urllib.error.URLError, ValueError) as e:
        log.warning("could not read the instance metadata at %s: %s", imds.base, e)
        return None
    if not (values["document"] and values["signature"]):
        log.warning("the instance metadata at %s has no signed instance identity document", imds.base)
    return CloudIdentity(**values)


def _imds(
    url: str, *, method: str = "GET", headers: dict[str, str], timeout: float = IMDS_TIMEOUT, limit: int = 4096
) -> str:
    req = urllib.request.Request(url, method=method, headers=headers, data=b"" if method == "PUT" else None)
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        return str(resp.read(limit).decode().strip())


def cloud_identity(cloud: str) -> CloudIdentity | None:
    """``--cloud``: "aws" reads IMDS; "kubernetes" (a pod has no metadata
    service) and "" (the default) read nothing."""
    if cloud == "aws":
        return aws_identity()
    if cloud and cloud != "kubernetes":
        log.warning("unknown --cloud %r: not reading any instance metadata", cloud)
    return None


# ------------------------------------------------------------------ power off


def default_power_off_command() -> str:
    return "systemctl poweroff" if Path("/run/systemd/system").is_dir() else "shutdown -h now"


def power_off(command: str, reason: str) -> bool:
    """Run the power-off command (split like a shell line, no shell); True if it exited 0."""
    log.warning("powering the machine off (%s): %s", reason, command)
    try:
        done = subprocess.run(shlex.split(command), stdin=subprocess.DEVNULL, timeout=POWER_OFF_TIMEOUT, check=False)
    except (OSError, ValueError, subprocess.TimeoutExpired) as e:
        log.error("the power-off command %r failed: %s", command, e)
        return False
    if done.returncode != 0:
        log.error("the power-off command %r exited with %d", command, done.returncode)
    return done.returncode == 0


def describe_seconds(seconds: float) -> str:
    if seconds >= 86400 and seconds % 3600 == 0:
        return f"{seconds / 86400:g} d"
    if seconds >= 3600:
        return f"{seconds / 3600:g} h"
    return f"{seconds:g} s"


__all__ = [
    "TOKEN_FILE",
    "Imds",
    "aws_identity",
    "cloud_identity",
    "default_power_off_command",
    "describe_seconds",
    "first_start",
    "power_off",
    "save_token",
    "saved_token",
]
