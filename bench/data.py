"""Data inputs (`--only data`): a 2 GB dataset (1 × 1 GB + 1,000 × 1 MB) in
moto's S3 over HTTP, listed as the server lists it (presigned URLs, ETags,
identities), fetched by the runner's own code (``trainyard_runner.data``)
into a machine cache and placed at a job's path.

- **download vs boto3**: the same objects fetched by a loop of boto3's
  ``download_file`` (its transfer manager: ranged GETs on 10 threads for the
  large object, one object after the other). Both run ``rounds`` times,
  alternating, on a cold cache and empty folders; the best of each counts.
- **second job on the same machine**: the same input fetched again into a
  new job's path with the cache warm: the time until the input is ready.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import time
from pathlib import Path
from typing import Any

import boto3
from boto3.s3.transfer import TransferConfig
from trainyard_runner.data import fetch_data
from trainyard_runner.protocol import DataFile, DataInput, DataPage

from bench.lib import log

BUCKET = "bench-data"
PREFIX = "dataset/"
LARGE = 1 << 30
SMALL, SMALL_COUNT = 1 << 20, 1000
TARGET_RATIO = 0.8
TARGET_READY_S = 1.0
WORKSPACE = "00000000-0000-4000-8000-00000000bench"


def bench_data(moto_url: str, tmp: Path, rounds: int = 2) -> dict[str, Any]:
    s3 = boto3.client(
        "s3",
        endpoint_url=moto_url,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    )
    _seed(s3)
    item = _listing(s3, moto_url)
    total = item.total_size
    ours, theirs = [], []
    for n in range(rounds):
        theirs.append(_boto3_loop(s3, tmp / f"boto3-{n}"))
        log(f"(data) boto3 download_file loop: {total / theirs[-1] / 1e6:.0f} MB/s")
        ours.append(_ours(item, tmp / f"machine-{n}", "job1")[0])
        log(f"(data) runner: {total / ours[-1] / 1e6:.0f} MB/s")
    best = min(ours)
    _, ready = _ours(item, tmp / f"machine-{rounds - 1}", "job2")  # the last machine's cache is warm
    placed = tmp / f"machine-{rounds - 1}" / "job2" / "dataset"
    identical = _same(s3, placed, [f.path for f in item.files[:3]] + [f.path for f in item.files[-1:]])
    for n in range(rounds):
        shutil.rmtree(tmp / f"machine-{n}", ignore_errors=True)
    _empty(s3)
    return {
        "bytes": total,
        "files": len(item.files),
        "ours_seconds": [round(s, 2) for s in ours],
        "boto3_seconds": [round(s, 2) for s in theirs],
        "ours_mb_s": round(total / best / 1e6, 1),
        "boto3_mb_s": round(total / min(theirs) / 1e6, 1),
        "ratio": round(min(theirs) / best, 3),
        "second_job_ready_s": round(ready, 3),
        "identical": identical,
    }


def data_rows(result: dict[str, Any], row: Any) -> None:
    size = f"{result['bytes'] / 1e9:.1f} GB, {result['files']:,} files"
    row(f"data input ({size}) from moto's S3: runner", f"{result['ours_mb_s']:.0f} MB/s", "", None)
    row("  boto3 download_file loop, same run (baseline)", f"{result['boto3_mb_s']:.0f} MB/s", "", None)
    row(
        "  runner vs boto3 throughput",
        f"{result['ratio'] * 100:.0f} %",
        f"≥ {TARGET_RATIO * 100:.0f} %",
        result["ratio"] >= TARGET_RATIO and result["identical"],
    )
    row(
        "  second job on the same machine: input ready",
        f"{result['second_job_ready_s'] * 1000:.0f} ms",
        f"≤ {TARGET_READY_S * 1000:.0f} ms",
        result["second_job_ready_s"] <= TARGET_READY_S,
    )


def _seed(s3: Any) -> None:
    started = time.monotonic()
    s3.create_bucket(Bucket=BUCKET)
    block = os.urandom(SMALL)
    for i in range(SMALL_COUNT):
        # Every object differs (its first bytes), as a dataset's files do.
        s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}shards/{i:04d}.bin", Body=i.to_bytes(8, "big") + block[8:])
    large = Path(f"/tmp/bench-data-{os.getpid()}.bin")
    with large.open("wb") as f:
        for _ in range(LARGE // SMALL):
            f.write(os.urandom(SMALL))
    try:
        s3.upload_file(str(large), BUCKET, f"{PREFIX}weights.bin")
    finally:
        large.unlink()
    log(f"(data) dataset seeded in {time.monotonic() - started:.0f} s")


def _listing(s3: Any, moto_url: str) -> DataInput:
    """The input as the server lists it (docs/DATA.md: identities and the snapshot)."""
    files = []
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix=PREFIX):
        for obj in page.get("Contents", []):
            etag = obj["ETag"].strip('"')
            ident = f"{WORKSPACE}|endpoint:{moto_url}|{BUCKET}|{obj['Key']}|{etag}|{obj['Size']}"
            url = s3.generate_presigned_url("get_object", Params={"Bucket": BUCKET, "Key": obj["Key"]}, ExpiresIn=3600)
            files.append(
                DataFile(
                    path=obj["Key"][len(PREFIX) :],
                    size=obj["Size"],
                    url=url,
                    etag=etag,
                    identity=hashlib.sha256(ident.encode()).hexdigest(),
                )
            )
    files.sort(key=lambda f: f.path)
    snapshot = hashlib.sha256("".join(f"{f.path}\0{f.identity}\n" for f in files).encode()).hexdigest()
    return DataInput(
        uri=f"s3://{BUCKET}/{PREFIX}",
        path="dataset",
        snapshot=snapshot,
        file_count=len(files),
        total_size=sum(f.size for f in files),
        files=files,
    )


def _ours(item: DataInput, machine: Path, job: str) -> tuple[float, float]:
    """(seconds to fetch and place, the same) for one job on ``machine``."""
    work = machine / job
    work.mkdir(parents=True)

    def page(path: str, after: str) -> DataPage:
        start = next((i + 1 for i, f in enumerate(item.files) if f.path == after), 0) if after else 0
        chunk = item.files[start : start + 1000]
        return DataPage(path=path, files=chunk, next=chunk[-1].path if start + 1000 < len(item.files) else "")

    started = time.monotonic()
    hold = asyncio.run(
        fetch_data([item.model_copy(update={"files": []})], work, cache_root=machine / "data", page=page)
    )
    seconds = time.monotonic() - started
    hold.release()
    return seconds, seconds


def _boto3_loop(s3: Any, dest: Path) -> float:
    dest.mkdir(parents=True)
    keys = [
        o["Key"] for p in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET) for o in p.get("Contents", [])
    ]
    config = TransferConfig()
    started = time.monotonic()
    for key in keys:
        target = dest / key
        target.parent.mkdir(parents=True, exist_ok=True)
        s3.download_file(BUCKET, key, str(target), Config=config)
    seconds = time.monotonic() - started
    shutil.rmtree(dest)
    return seconds


def _same(s3: Any, placed: Path, paths: list[str]) -> bool:
    for path in paths:
        want = hashlib.sha256(s3.get_object(Bucket=BUCKET, Key=PREFIX + path)["Body"].read()).digest()
        if hashlib.sha256((placed / path).read_bytes()).digest() != want:
            return False
    return True


def _empty(s3: Any) -> None:
    for page in s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET):
        for obj in page.get("Contents", []):
            s3.delete_object(Bucket=BUCKET, Key=obj["Key"])
    s3.delete_bucket(Bucket=BUCKET)
