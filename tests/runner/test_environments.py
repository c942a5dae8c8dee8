"""runner/trainyard_runner/environments.py with real uv, a real interpreter
and a real package index on localhost: the key, build once, reuse, the
lock, concurrent jobs, and the errors a user sees."""

from __future__ import annotations

import asyncio
import hashlib
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from trainyard_runner.environments import (
    READY_FILE,
    Environment,
    EnvironmentBuildError,
    _pack,
    evict,
    prepare_environment,
)
from trainyard_runner.protocol import EnvironmentSpec
from trainyard_spec.environments import environment_files as spec_environment_files
from trainyard_spec.environments import recipe_of as spec_recipe_of

from tests.support.pkgindex import PackageIndex, package_index


@pytest.fixture
def index(tmp_path: Path) -> Iterator[PackageIndex]:
    with package_index(tmp_path / "index") as index:
        index.add("tinypkg", "1.0")
        yield index


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    path = tmp_path / "checkout"
    path.mkdir()
    (path / "requirements.txt").write_text("tinypkg\n")
    return path


class Log:
    def __init__(self) -> None:
        self.lines: list[str] = []

    async def __call__(self, stream: str, lines: list[str]) -> None:
        self.lines.extend(lines)

    def said(self) -> list[str]:
        return [line for line in self.lines if line.startswith("[trainyard] environment")]


def prepare(spec: EnvironmentSpec, root: Path, checkout: Path, index: PackageIndex, log: Log) -> Environment:
    env = {**os.environ, "UV_INDEX_URL": index.url, "UV_CACHE_DIR": str(root.parent / "uv-cache")}
    return asyncio.run(prepare_environment(spec, root=root, checkout=checkout, env=env, say=log))


def tinypkg_in(env: Environment) -> list[str]:
    """What the environment's own python says: tinypkg's version and its prefix."""
    code = "import sys, tinypkg; print(tinypkg.VERSION, sys.prefix)"
    out = subprocess.run(["python", "-c", code], env=env.activate(os.environ), capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return out.stdout.split()


def test_built_once_then_reused_with_the_lock_and_the_packages(tmp_path: Path, checkout: Path, index: PackageIndex):
    spec = EnvironmentSpec(python="3.11", requirements="requirements.txt")
    first_log, second_log = Log(), Log()
    first = prepare(spec, tmp_path / "envs", checkout, index, first_log)
    second = prepare(spec, tmp_path / "envs", checkout, index, second_log)

    assert first.built and not second.built
    assert first.key == second.key and first.path == second.path == tmp_path / "envs" / first.key
    assert first_log.said()[-1].startswith(f"[trainyard] environment {first.key}: built in ")
    assert second_log.said() == [f"[trainyard] environment {first.key}: reused (built in {first.build_seconds:.1f} s)"]
    assert "tinypkg==1.0" in first.lock and "--hash=sha256:" in first.lock
    assert second.lock == first.lock and second.packages.strip() == "tinypkg==1.0"
    assert tinypkg_in(second) == ["1.0", str(second.path)]
    assert not list((tmp_path / "envs").glob("*.building*"))


def test_the_key_follows_the_requirements_and_the_files_they_include(
    tmp_path: Path, checkout: Path, index: PackageIndex
):
    spec = EnvironmentSpec(requirements="requirements.txt")
    (checkout / "requirements.txt").write_text("-r base.txt\n")
    (checkout / "base.txt").write_text("tinypkg\n")
    keys = [prepare(spec, tmp_path / "envs", checkout, index, Log()).key]
    (checkout / "base.txt").write_text("tinypkg  # the same, written differently\n")
    keys.append(prepare(spec, tmp_path / "envs", checkout, index, Log()).key)
    keys.append(
        prepare(spec.model_copy(update={"pip": ["tinypkg==1.0"]}), tmp_path / "envs", checkout, index, Log()).key
    )
    keys.append(prepare(spec, tmp_path / "envs", checkout, index, Log()).key)
    assert len(set(keys[:3])) == 3 and keys[3] == keys[1]


def test_the_recipe_the_runner_reports_is_the_one_the_server_computes_from_the_clis_digests(
    tmp_path: Path, checkout: Path, index: PackageIndex
):
    """--dry-run finds a built environment by its recipe: the runner's (from
    its checkout) and the server's (trainyard_spec, from the digests the CLI
    read in the working tree) must agree, includes and all."""
    (checkout / "reqs").mkdir()
    (checkout / "reqs" / "train.txt").write_text("-r ../base.txt\n-c constraints.txt\n")
    (checkout / "reqs" / "constraints.txt").write_text("tinypkg<2\n")
    (checkout / "base.txt").write_text("tinypkg\n")
    spec = EnvironmentSpec(python="", requirements="./reqs/train.txt", pip=["tinypkg==1.0"], setup=["true"])
    built = prepare(spec, tmp_path / "envs", checkout, index, Log())

    def read(name: str) -> bytes | None:
        path = checkout / name
        return path.read_bytes() if path.is_file() else None

    files = spec_environment_files("./reqs/train.txt", read)
    assert sorted(files) == ["base.txt", "reqs/constraints.txt", "reqs/train.txt"]
    assert built.recipe == spec_recipe_of(spec.model_dump(exclude_defaults=True), files)
    assert built.report().recipe == built.recipe
    # A re-run's lock is not part of it: the recipe names what was asked for.
    again = prepare(spec.model_copy(update={"lock": built.lock}), tmp_path / "envs", checkout, index, Log())
    assert again.key != built.key and again.recipe == built.recipe


def test_two_jobs_needing_a_new_key_at_once_build_it_once(tmp_path: Path, checkout: Path, index: PackageIndex):
    spec = EnvironmentSpec(requirements="requirements.txt", setup=["sleep 1"])  # the build takes a while
    logs = [Log(), Log()]
    results: list[Environment] = []
    threads = [
        threading.Thread(target=lambda log=log: results.append(prepare(spec, tmp_path / "envs", checkout, index, log)))
        for log in logs
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert sorted(r.built for r in results) == [False, True]
    waiting = [log for log in logs if any("another job is building it; waiting" in line for line in log.said())]
    assert len(waiting) == 1 and waiting[0].said()[-1].endswith(f"reused (built in {results[0].build_seconds:.1f} s)")


def test_a_python_the_machine_does_not_have_is_said_plainly(tmp_path: Path, checkout: Path, index: PackageIndex):
    with pytest.raises(EnvironmentBuildError) as e:
        prepare(EnvironmentSpec(python="3.99"), tmp_path / "envs", checkout, index, Log())
    assert str(e.value) == (
        "environment: python 3.99 is not installed on this runner's machine (python3.99 is not on PATH);"
        " install it there or pick a version the machine has"
    )


def test_a_missing_requirements_file_is_said_plainly(tmp_path: Path, checkout: Path, index: PackageIndex):
    with pytest.raises(EnvironmentBuildError, match=r"requirements: reqs/gpu.txt is not in the repository"):
        prepare(EnvironmentSpec(requirements="reqs/gpu.txt"), tmp_path / "envs", checkout, index, Log())


def test_a_failed_build_leaves_nothing_and_the_next_job_builds_again(
    tmp_path: Path, checkout: Path, index: PackageIndex
):
    spec = EnvironmentSpec(requirements="requirements.txt", setup=["test -e ready-to-build"])
    log = Log()
    with pytest.raises(EnvironmentBuildError) as e:
        prepare(spec, tmp_path / "envs", checkout, index, log)
    assert str(e.value) == "environment: running the setup commands failed (exit code 1)"
    assert [p.name for p in (tmp_path / "envs").iterdir() if not p.name.endswith((".use", ".build"))] == []
    (checkout / "ready-to-build").touch()
    assert prepare(spec, tmp_path / "envs", checkout, index, Log()).built


def test_unsatisfiable_requirements_fail_with_the_resolvers_reason(tmp_path: Path, checkout: Path, index: PackageIndex):
    (checkout / "requirements.txt").write_text("tinypkg==7.0\n")
    with pytest.raises(EnvironmentBuildError) as e:
        prepare(EnvironmentSpec(requirements="requirements.txt"), tmp_path / "envs", checkout, index, Log())
    assert str(e.value).startswith("environment: resolving the requirements failed (exit code 1): ")
    assert "tinypkg==7.0" in str(e.value)


def test_a_recorded_lock_is_installed_as_it_is_while_the_index_offers_newer(
    tmp_path: Path, checkout: Path, index: PackageIndex
):
    spec = EnvironmentSpec(requirements="requirements.txt")
    first = prepare(spec, tmp_path / "envs", checkout, index, Log())
    index.add("tinypkg", "1.1")
    log = Log()
    again = prepare(spec.model_copy(update={"lock": first.lock}), tmp_path / "envs", checkout, index, log)
    assert again.built and again.key != first.key  # the lock is part of the key
    assert "[trainyard] installing the recorded lock (a re-run): nothing is resolved again" in log.lines
    assert again.lock == first.lock and again.packages.strip() == "tinypkg==1.0"
    assert (
        prepare(
            spec.model_copy(update={"pip": ["# resolve again"]}), tmp_path / "envs", checkout, index, Log()
        ).packages.strip()
        == "tinypkg==1.1"
    )


def test_eviction_removes_the_least_recently_used_but_never_one_in_use(
    tmp_path: Path, checkout: Path, index: PackageIndex
):
    root = tmp_path / "envs"
    old = prepare(EnvironmentSpec(requirements="requirements.txt"), root, checkout, index, Log())
    old.release()
    used = prepare(
        EnvironmentSpec(requirements="requirements.txt", pip=["# another key"]), root, checkout, index, Log()
    )
    assert used.lock_fd is not None  # held by the job running in it

    assert evict(root, keep="", max_bytes=1 << 40, max_age_seconds=3600) == []  # within budget and age
    os.utime(root / old.key / READY_FILE, (time.time() - 7200, time.time() - 7200))
    assert evict(root, keep="", max_bytes=1 << 40, max_age_seconds=3600) == [old.key]  # unused too long
    assert evict(root, keep="", max_bytes=0, max_age_seconds=3600) == []  # over budget, but in use
    assert (root / used.key / READY_FILE).exists()
    used.release()
    assert evict(root, keep="", max_bytes=0, max_age_seconds=3600) == [used.key]
    assert not (root / used.key).exists()

    log = Log()  # the next job that needs it builds it again
    assert prepare(EnvironmentSpec(requirements="requirements.txt"), root, checkout, index, log).built


class Shelf:
    """A Store over the test's package-index server: what was packed is
    served from its folder (the server's storage and signed URLs are the
    e2e tests' part)."""

    def __init__(self, index: PackageIndex) -> None:
        self.index = index
        self.packed: dict[str, tuple[str, int, str]] = {}

    async def find(self, key: str) -> tuple[str, int, str] | None:
        return self.packed.get(key)

    async def begin(self, key: str, size: int, sha256: str) -> tuple[str, dict[str, str]] | None:
        return None

    async def done(self, key: str) -> None:
        raise AssertionError("nothing is uploaded here")

    def put(self, key: str, archive: Path, *, sha256: str | None = None) -> None:
        served = self.index.root / "envs" / archive.name
        served.parent.mkdir(exist_ok=True)
        shutil.copyfile(archive, served)
        digest = sha256 or hashlib.sha256(served.read_bytes()).hexdigest()
        self.packed[key] = (
            f"{self.index.url.removesuffix('/simple')}/envs/{archive.name}",
            served.stat().st_size,
            digest,
        )


def test_a_packed_environment_restores_on_another_machine_and_a_bad_one_is_built(
    tmp_path: Path, checkout: Path, index: PackageIndex
):
    spec = EnvironmentSpec(requirements="requirements.txt", setup=["sleep 1"])
    built = prepare(spec, tmp_path / "here", checkout, index, Log())
    built.release()
    archive = tmp_path / "packed.tar.gz"
    _pack(built.path, archive)
    shelf = Shelf(index)
    shelf.put(built.key, archive)

    log = Log()
    env = {**os.environ, "UV_INDEX_URL": index.url}
    there = asyncio.run(
        prepare_environment(spec, root=tmp_path / "there", checkout=checkout, env=env, say=log, store=shelf)
    )
    assert log.said() == [
        f"[trainyard] environment {built.key}: restored from storage in "
        + log.said()[0].split("restored from storage in ")[1]
    ]
    assert not there.built and there.lock == built.lock and there.path == tmp_path / "there" / built.key
    assert tinypkg_in(there) == ["1.0", str(there.path)]
    # The interpreter link was made again for this machine's python3 (it is not in the archive).
    real = subprocess.run(["python3", "-c", "import sys; print(sys.executable)"], capture_output=True, text=True)
    assert Path(os.readlink(there.path / "bin" / "python")).resolve() == Path(real.stdout.strip()).resolve()

    # A packed file that is not what the server recorded is not used: the job builds.
    shelf.put(built.key, archive, sha256="0" * 64)
    log = Log()
    again = asyncio.run(
        prepare_environment(spec, root=tmp_path / "elsewhere", checkout=checkout, env=env, say=log, store=shelf)
    )
    assert again.built
    assert any("could not restore it from storage (the packed environment does not match" in s for s in log.said())


def _escaping_archive(path: Path) -> None:
    """Members each harmless read one by one against an empty folder, but
    extracted in order they write outside it: ``s`` links to ``.``, so
    ``s/up -> ..`` lands as ``up`` pointing above the folder, and
    ``up/escaped`` goes through it."""
    import io
    import tarfile

    with tarfile.open(path, "w") as tar:
        for name, target in (("s", "."), ("s/up", "..")):
            link = tarfile.TarInfo(name)
            link.type, link.linkname = tarfile.SYMTYPE, target
            tar.addfile(link)
        data = b"written outside\n"
        member = tarfile.TarInfo("up/escaped")
        member.size = len(data)
        tar.addfile(member, io.BytesIO(data))


def test_a_packed_environment_is_checked_by_the_parser_that_extracts_it(tmp_path: Path) -> None:
    import tarfile

    from trainyard_runner.environments import _unpack

    archive = tmp_path / "evil.tar"
    _escaping_archive(archive)
    dest = tmp_path / "box" / "env"
    dest.parent.mkdir()

    with pytest.raises(tarfile.FilterError, match="outside the destination"):
        _unpack(archive, dest, "/usr/bin/python3")

    assert not (tmp_path / "box" / "escaped").exists()
    assert not (tmp_path / "escaped").exists()
    assert not (dest / "up").exists()
