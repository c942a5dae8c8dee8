"""Every string and list a runner sends is bounded by the protocol
(docs/RUNNER.md, "Bounds"; docs/decisions/0081-linear-redaction.md).

Free text is cut to its bound, by the server's validation as by the models
the runner builds its frames with, so a legitimate runner's long text (a git
error, a long hostname) is never a bad frame. An id, a lease or a list past
its bound is a bad frame: no runner reaches one.
"""

from __future__ import annotations

import copy
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import ValidationError
from trainyard_runner import protocol as p
from trainyard_runner.resources import parse_nvidia_smi

MIB = 1 << 20
LONG = "x" * MIB

# One valid frame of each type a runner sends, every optional field filled in.
FRAMES: dict[str, dict[str, Any]] = {
    "hello": {
        "type": "hello",
        "version": "0.1.0",
        "hostname": "box",
        "address": "10.0.0.7",
        "resources": {"cpus": 2, "memory_bytes": 1, "disk_bytes": 1, "gpus": [{"name": "A100", "memory_bytes": 1}]},
        "running_jobs": [{"job": "j", "attempt": 1, "lease": "l", "confirmed": True, "ports": [5000]}],
        "cloud": {"instance_id": "i-0abc", "instance_type": "g5.xlarge", "region": "eu-west-1", "zone": "eu-west-1a"},
        "relay": 1,
        "ssh_host_key": "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIGx3 trainyard-runner",
    },
    "job_accepted": {"type": "job_accepted", "job": "j", "attempt": 1, "lease": "l", "ports": [5000]},
    "job_rejected": {"type": "job_rejected", "job": "j", "attempt": 1, "lease": "l", "reason": "busy"},
    "job_state": {
        "type": "job_state",
        "job": "j",
        "attempt": 1,
        "state": "failed",
        "exit_code": 1,
        "reason": "clone failed",
        "interrupt_at": 1.0,
        "log_lines": 1,
        "log_digest": "0" * 16,
        "environment": {
            "key": "0" * 24,
            "built": True,
            "build_seconds": 1.0,
            "size_bytes": 1,
            "lock": "torch==2.3.0",
            "packages": "torch 2.3.0",
            "platform": {"os": "linux", "python": "3.11.7"},
            "recipe": "0" * 64,
        },
    },
    "logs": {
        "type": "logs",
        "job": "j",
        "attempt": 1,
        "first_seq": 1,
        "streams": "o",
        "times": [[1, 1.0]],
        "text": "x\n",
    },
    "heartbeat": {"type": "heartbeat", "state": "idle"},
}
# Where a string may be kept longer than a name: the most kept of each.
KEPT = {
    ("job_state", "reason"): p.MAX_REASON_CHARS,
    ("job_rejected", "reason"): p.MAX_REJECTION_CHARS,
    ("job_state", "environment", "lock"): 2_000_000,
    ("job_state", "environment", "packages"): 2_000_000,
}

KEY = "[key]"  # a path's last step: the key itself, not its value


def _strings(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path of every string in a frame (a dict's key: ``(…, key, KEY)``)."""
    if isinstance(value, str):
        yield path
    elif isinstance(value, dict):
        for key, item in value.items():
            yield (*path, key, KEY)
            yield from _strings(item, (*path, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _strings(item, (*path, i))


def _lists(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path of every list in a frame, lists in lists too."""
    if isinstance(value, list):
        yield path
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        yield from _lists(item, (*path, key))


def _with(frame: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(frame)
    parent = changed
    for step in path[:-2] if path[-1] == KEY else path[:-1]:
        parent = parent[step]
    if path[-1] == KEY:
        parent[value] = parent.pop(path[-2])
    else:
        parent[path[-1]] = value
    return changed


def _at(message: Any, path: tuple[Any, ...]) -> Any:
    value = message.model_dump()
    for step in path:
        value = value[step]
    return value


CASES = [(name, path) for name, frame in FRAMES.items() for path in _strings(frame)]


def test_every_frame_is_valid_as_written() -> None:
    for frame in FRAMES.values():
        p.runner_message.validate_json(json.dumps(frame))


@pytest.mark.parametrize(("name", "path"), CASES, ids=[f"{n}.{'.'.join(map(str, s))}" for n, s in CASES])
def test_a_1_mib_string_in_any_field_is_cut_or_refused(name: str, path: tuple[Any, ...]) -> None:
    raw = json.dumps(_with(FRAMES[name], path, LONG))
    start = time.perf_counter()
    try:
        message = p.runner_message.validate_json(raw)
    except ValidationError:
        return  # a bad frame (4400)
    finally:
        assert time.perf_counter() - start < 0.1
    kept = len(LONG) if path[-1] == KEY else len(_at(message, path))
    assert kept <= KEPT.get((name, *(s for s in path if not isinstance(s, int))), p.MAX_NAME_CHARS)


LISTS = [(name, path) for name, frame in FRAMES.items() for path in _lists(frame)]


@pytest.mark.parametrize(("name", "path"), LISTS, ids=[f"{n}.{'.'.join(map(str, s))}" for n, s in LISTS])
def test_a_list_past_any_bound_is_refused(name: str, path: tuple[Any, ...]) -> None:
    frame = FRAMES[name]
    item = _at_raw(frame, path)[0]
    with pytest.raises(ValidationError):
        p.runner_message.validate_json(json.dumps(_with(frame, path, [item] * (p.MAX_FRAME_LINES + 1))))


def _at_raw(frame: dict[str, Any], path: tuple[Any, ...]) -> Any:
    value: Any = frame
    for step in path:
        value = value[step]
    return value


def test_more_platform_facts_than_the_bound_are_refused() -> None:
    facts = {f"fact{i}": "x" for i in range(p.MAX_PLATFORM_FACTS + 1)}
    frame = _with(FRAMES["job_state"], ("environment", "platform"), facts)
    with pytest.raises(ValidationError):
        p.runner_message.validate_json(json.dumps(frame))


def test_a_log_text_over_the_servers_message_limit_is_refused() -> None:
    line = "y" * 1023 + "\n"
    lines = p.MAX_LOG_TEXT_CHARS // len(line) + 1
    frame = {**FRAMES["logs"], "streams": "o" * lines, "times": [[lines, 1.0]], "text": line * lines}
    with pytest.raises(ValidationError, match="at most"):
        p.runner_message.validate_json(json.dumps(frame))
    fits = lines - 1
    p.runner_message.validate_json(
        json.dumps({**frame, "streams": "o" * fits, "times": [[fits, 1.0]], "text": line * fits})
    )


def test_ids_and_lists_up_to_their_bounds_are_accepted() -> None:
    longest = "j" * p.MAX_ID_CHARS
    held = {"job": longest, "attempt": 1, "lease": longest, "confirmed": False, "ports": list(range(p.MAX_PORTS))}
    hello = {**FRAMES["hello"], "running_jobs": [held] * p.MAX_HELD_JOBS}
    hello["resources"] = {**hello["resources"], "gpus": [{"name": "A100", "memory_bytes": 1}] * p.MAX_GPUS}

    message = p.runner_message.validate_json(json.dumps(hello))

    assert isinstance(message, p.Hello) and len(message.running_jobs) == p.MAX_HELD_JOBS


def test_a_runners_long_texts_are_cut_by_the_models_it_builds_frames_with() -> None:
    """What the runner sends is within the bounds, so a legitimate runner is never refused."""
    git_error = "clone of https://github.com/acme/m.git failed (exit 128): " + "fatal: remote error\n" * 50_000
    state = p.JobState(job="j", attempt=1, state="failed", reason=git_error)
    rejected = p.JobRejected(job="j", attempt=1, lease="l", reason=git_error)
    gpu = p.Gpu(name="NVIDIA " * 100, memory_bytes=1)
    hello = p.Hello(
        version="0.1.0.dev" + "9" * 300,
        hostname="h" * 300,
        address="a" * 300,
        resources=p.Resources(cpus=1, memory_bytes=1, disk_bytes=1, gpus=[gpu]),
        cloud=p.CloudIdentity(instance_id="i" * 5000),
    )

    assert state.reason == git_error[: p.MAX_REASON_CHARS]
    assert rejected.reason == git_error[: p.MAX_REJECTION_CHARS]
    assert [len(t) for t in (hello.version, hello.hostname, hello.address, gpu.name)] == [p.MAX_NAME_CHARS] * 4
    assert hello.cloud is not None and len(hello.cloud.instance_id) == p.MAX_NAME_CHARS
    for frame in (state, rejected, hello):
        assert p.runner_message.validate_json(frame.model_dump_json()) == frame


def test_a_machine_with_more_gpus_than_a_hello_may_name_reports_the_first_ones() -> None:
    out = "".join(f"NVIDIA H100 {i}, 81559\n" for i in range(p.MAX_GPUS + 8))

    gpus = parse_nvidia_smi(out)

    assert [g.name for g in gpus] == [f"NVIDIA H100 {i}" for i in range(p.MAX_GPUS)]
    p.Resources(cpus=1, memory_bytes=1, disk_bytes=1, gpus=gpus)
