"""A job's persistent volumes (``AssignJob.volumes``; docs/DATA.md, "Volumes").

Each volume is a folder of the machine, ``<volumes dir>/<volume_id>``
(``TRAINYARD_RUNNER_VOLUMES_DIR``, default ``<work dir>/volumes``), and the
job's ``path`` is a link to it (inside the working directory; an absolute
path only where the runner may write outside it).

- ``directory``: the folder itself (made when missing).
- ``ebs``: the server attached the EBS volume before it sent the job; its
  block device is found in the device links (``TRAINYARD_RUNNER_DEVICE_DIR``,
  default ``/dev/disk/by-id``) as ``nvme-Amazon_Elastic_Block_Store_vol<hex>``
  (Nitro machines), else by the name it was attached as (``/dev/sdf``, seen
  as ``/dev/xvdf`` on Xen machines). A device ``blkid`` finds no filesystem
  on gets ``mkfs.ext4`` (its first use); it is mounted on the folder
  (read-only for ``read_only``) and unmounted at the job's end, before the
  job's final state is sent, so the server may detach it then.

A job with a user of its own (a root runner, ``jobuser.py``) owns what is on
the volume (a new uid each job, so the files are given to it each time); a
``read_only`` volume stays root's, which the job can read and not write.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from . import jobuser
from .protocol import VolumeMount

log = logging.getLogger(__name__)

DEVICE_DIR_VAR = "TRAINYARD_RUNNER_DEVICE_DIR"
VOLUMES_DIR_VAR = "TRAINYARD_RUNNER_VOLUMES_DIR"
DEFAULT_DEVICE_DIR = "/dev/disk/by-id"
NVME_PREFIX = "nvme-Amazon_Elastic_Block_Store_"
DEVICE_WAIT_SECONDS = 120.0  # an attached EBS volume takes seconds to show up
COMMAND_SECONDS = 300.0  # mkfs of a large volume


class VolumeError(Exception):
    """A volume could not be mounted; the message says which and why."""


@dataclass
class Mounted:
    """A volume in place for a job: its folder, the link at the job's path,
    and whether a block device was mounted on the folder."""

    volume: VolumeMount
    folder: Path
    link: Path
    device_mounted: bool = False


def volumes_dir(work_root: Path) -> Path:
    return Path(os.environ.get(VOLUMES_DIR_VAR) or work_root / "volumes")


def mount_all(
    volumes: list[VolumeMount], *, work_root: Path, work: Path, user: jobuser.JobUser | None, absolute_ok: bool
) -> list[Mounted]:
    """Every volume in place at its path; ``VolumeError`` (after undoing
    what was done) when one cannot be."""
    done: list[Mounted] = []
    try:
        for volume in volumes:
            done.append(_mount(volume, work_root=work_root, work=work, user=user, absolute_ok=absolute_ok))
    except BaseException:
        unmount_all(done)
        raise
    return done


def unmount_all(mounted: list[Mounted]) -> None:
    """Remove each link and unmount each device (lazily when still busy). Never raises."""
    for item in reversed(mounted):
        with contextlib.suppress(OSError):
            if item.link.is_symlink():
                item.link.unlink()
        if item.device_mounted:
            try:
                if _run(["umount", str(item.folder)], check=False) != 0:
                    log.warning("volume %s: %s busy, unmounting lazily", item.volume.name, item.folder)
                    _run(["umount", "-l", str(item.folder)], check=False)
            except (VolumeError, OSError, subprocess.SubprocessError):
                log.exception("volume %s: could not unmount %s", item.volume.name, item.folder)


def _mount(
    volume: VolumeMount, *, work_root: Path, work: Path, user: jobuser.JobUser | None, absolute_ok: bool
) -> Mounted:
    if not volume.volume_id or "/" in volume.volume_id or volume.volume_id in (".", ".."):
        raise VolumeError(f"volume {volume.name}: bad volume id {volume.volume_id!r}")
    link = _link_path(volume, work=work, absolute_ok=absolute_ok)
    folder = volumes_dir(work_root) / volume.volume_id
    folder.mkdir(parents=True, exist_ok=True)
    item = Mounted(volume, folder, link)
    if volume.kind == "ebs":
        device = _find_device(volume)
        _ensure_filesystem(volume, device)
        options = ["-o", "ro"] if volume.read_only else []
        if _run(["mount", *options, str(device), str(folder)], check=False) != 0:
            raise VolumeError(f"volume {volume.name}: could not mount {device} on {folder}")
        item.device_mounted = True
    try:
        if user is not None:
            jobuser.make_reachable(folder)
            if volume.read_only and volume.kind == "directory":
                jobuser.take_back(folder)  # root's, not writable by the job's user (an EBS one is mounted ro)
            elif not volume.read_only:
                jobuser.give(folder, user.uid, user.gid)
        link.parent.mkdir(parents=True, exist_ok=True)
        if link.is_symlink():
            link.unlink()
        link.symlink_to(folder, target_is_directory=True)
    except OSError as e:
        unmount_all([item])
        raise VolumeError(f"volume {volume.name}: could not place it at {volume.path}: {e}") from e
    log.info("volume %s (%s) at %s", volume.name, volume.volume_id, link)
    return item


def _link_path(volume: VolumeMount, *, work: Path, absolute_ok: bool) -> Path:
    path = PurePosixPath(volume.path)
    if ".." in path.parts:
        raise VolumeError(f"volume {volume.name}: path {volume.path} may not contain '..'")
    if path.is_absolute():
        if not absolute_ok:
            raise VolumeError(
                f"volume {volume.name}: path {volume.path} is absolute, and this machine's jobs write inside their"
                " working directory only; use a relative path (e.g. ./data)"
            )
        link = Path(path)
    else:
        link = work / path
    if link.exists() and not link.is_symlink():
        raise VolumeError(
            f"volume {volume.name}: {volume.path} exists already (in the code?); mount the volume at a free path"
        )
    return link


def _find_device(volume: VolumeMount) -> Path:
    """The volume's block device, waiting up to ``DEVICE_WAIT_SECONDS`` for it to show up."""
    links = Path(os.environ.get(DEVICE_DIR_VAR) or DEFAULT_DEVICE_DIR)
    nvme = links / f"{NVME_PREFIX}{volume.volume_id.replace('-', '')}"
    names = [nvme]
    if volume.device.startswith("/dev/sd"):
        names += [Path(volume.device.replace("/dev/sd", "/dev/xvd", 1)), Path(volume.device)]
    deadline = time.monotonic() + DEVICE_WAIT_SECONDS
    while True:
        for name in names:
            if name.exists():
                return name.resolve()
        if time.monotonic() > deadline:
            looked = ", ".join(str(n) for n in names)
            raise VolumeError(
                f"volume {volume.name}: its device did not show up within {DEVICE_WAIT_SECONDS:.0f}s"
                f" (looked for {looked})"
            )
        time.sleep(0.5)


def _ensure_filesystem(volume: VolumeMount, device: Path) -> None:
    """``mkfs.ext4`` only when ``blkid`` says the device holds nothing it knows (exit 2):
    any other answer keeps the device as it is."""
    found = _run(["blkid", "-p", str(device)], check=False)
    if found == 0:
        return
    if found != 2:
        raise VolumeError(f"volume {volume.name}: blkid could not read {device} (exit {found})")
    if volume.read_only:
        raise VolumeError(f"volume {volume.name}: it is empty (no filesystem) and mounted read-only")
    log.info("volume %s: no filesystem on %s, making ext4", volume.name, device)
    if _run(["mkfs.ext4", "-q", "-F", str(device)], check=False) != 0:
        raise VolumeError(f"volume {volume.name}: mkfs.ext4 {device} failed")


def _run(command: list[str], *, check: bool) -> int:
    if shutil.which(command[0]) is None:
        raise VolumeError(f"{command[0]} is not installed on this machine (needed for volumes)")
    done = subprocess.run(command, capture_output=True, timeout=COMMAND_SECONDS, check=False)
    if done.returncode != 0:
        log.debug("%s: exit %s: %s", " ".join(command), done.returncode, done.stderr.decode(errors="replace")[-500:])
    if check and done.returncode != 0:
        raise VolumeError(f"{' '.join(command)} failed: {done.stderr.decode(errors='replace')[-300:]}")
    return done.returncode
