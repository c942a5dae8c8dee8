from __future__ import annotations

import hashlib
import os
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
from trainyard.code import (
    Workspace,
    archive_files,
    code_digests,
    file_sha256,
    find_workspace,
    git_patch,
    head_commit,
    make_archive,
    prepare_code,
)


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout


@pytest.fixture(autouse=True)
def _git_identity(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for who in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{who}_NAME", "Test")
        monkeypatch.setenv(f"GIT_{who}_EMAIL", "test@example.com")


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A pushed repo, then: a modified tracked file, a deleted tracked file,
    a staged change, new untracked text and binary files, an ignored file."""
    origin = tmp_path / "origin.git"
    git(tmp_path, "init", "-q", "--bare", str(origin))
    work = tmp_path / "work"
    work.mkdir()
    git(work, "init", "-q", "-b", "main")
    (work / ".gitignore").write_text("*.log\ndata/\n")
    (work / "train.py").write_text("print('v1')\n")
    (work / "old.txt").write_text("to be deleted\n")
    (work / "staged.txt").write_text("one\n")
    git(work, "add", "-A")
    git(work, "commit", "-q", "-m", "init")
    git(work, "remote", "add", "origin", str(origin))
    git(work, "push", "-q", "origin", "main")
    (work / "train.py").write_text("print('v2')\n")
    (work / "old.txt").unlink()
    (work / "staged.txt").write_text("two\n")
    git(work, "add", "staged.txt")
    (work / "new_dir").mkdir()
    (work / "new_dir" / "new.py").write_text("print('new')\n")
    (work / "blob.bin").write_bytes(bytes(range(256)) * 40)
    (work / "run.log").write_text("ignored\n")
    (work / "data").mkdir()
    (work / "data" / "big.csv").write_text("ignored too\n")
    return work


def tree_files(root: Path) -> dict[str, bytes]:
    return {
        p.relative_to(root).as_posix(): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".git" not in p.relative_to(root).parts
    }


def test_patch_reproduces_the_working_tree_on_a_fresh_clone(repo: Path, tmp_path: Path):
    patch = git_patch(repo)
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(tmp_path / "origin.git"), str(clone))
    git(clone, "checkout", "-q", head_commit(repo) or "")
    (tmp_path / "code.patch").write_bytes(patch)
    git(clone, "apply", "--binary", str(tmp_path / "code.patch"))
    expected = {k: v for k, v in tree_files(repo).items() if k not in ("run.log", "data/big.csv")}
    assert tree_files(clone) == expected
    assert "old.txt" not in expected and "blob.bin" in expected and "new_dir/new.py" in expected


def test_patch_leaves_the_users_index_untouched(repo: Path):
    before = (git(repo, "status", "--porcelain"), git(repo, "ls-files", "-s"), git(repo, "diff", "--cached"))
    git_patch(repo)
    after = (git(repo, "status", "--porcelain"), git(repo, "ls-files", "-s"), git(repo, "diff", "--cached"))
    assert after == before
    assert "?? blob.bin" in before[0] and "M  staged.txt" in before[0]


def test_patch_of_a_clean_tree_is_empty(repo: Path):
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "all")
    assert git_patch(repo) == b""


def test_archive_has_tracked_and_untracked_but_not_ignored_files(repo: Path, tmp_path: Path):
    workspace = find_workspace(repo / "new_dir")
    assert workspace == Workspace(root=repo, is_git=True)
    assert archive_files(workspace) == [".gitignore", "blob.bin", "new_dir/new.py", "staged.txt", "train.py"]
    make_archive(workspace, tmp_path / "code.tar.gz")
    with tarfile.open(tmp_path / "code.tar.gz") as tar:
        assert sorted(tar.getnames()) == [".gitignore", "blob.bin", "new_dir/new.py", "staged.txt", "train.py"]
        assert tar.extractfile("train.py").read() == b"print('v2')\n"


def test_archive_outside_git_has_every_file_but_git_dirs(tmp_path: Path):
    root = tmp_path / "plain"
    (root / "sub" / ".git").mkdir(parents=True)
    (root / "sub" / ".git" / "HEAD").write_text("x")
    (root / "sub" / "a.py").write_text("a")
    (root / "run.log").write_text("kept: no git, no ignore rules")
    workspace = find_workspace(root)
    assert workspace == Workspace(root=root, is_git=False)
    assert archive_files(workspace) == ["run.log", "sub/a.py"]


class FakeUploads:
    def __init__(self) -> None:
        self.blobs: list[bytes] = []

    def __call__(self, data: bytes | Path) -> dict[str, object]:
        self.blobs.append(data.read_bytes() if isinstance(data, Path) else data)
        return {"id": f"blob-{len(self.blobs)}", "size": len(self.blobs[-1]), "sha256": "x"}


def test_prepare_code_sends_remote_commit_and_patch(repo: Path):
    uploads, warnings = FakeUploads(), []
    code = prepare_code(Workspace(repo, True), force_upload=False, upload_blob=uploads, warn=warnings.append)
    assert code == {
        "kind": "git",
        "repo_url": str(repo.parent / "origin.git"),
        "commit": head_commit(repo),
        "patch_blob": "blob-1",
    }
    assert uploads.blobs == [git_patch(repo)]
    assert warnings == []


def test_prepare_code_warns_when_head_is_not_pushed(repo: Path):
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "local only")
    uploads, warnings = FakeUploads(), []
    code = prepare_code(Workspace(repo, True), force_upload=False, upload_blob=uploads, warn=warnings.append)
    assert code["patch_blob"] is None and uploads.blobs == []
    assert len(warnings) == 1 and "is on no remote branch" in warnings[0]


@pytest.mark.parametrize("force_upload", [True, False])
def test_prepare_code_uploads_an_archive_with_upload_or_without_a_remote(repo: Path, force_upload: bool):
    if not force_upload:
        git(repo, "remote", "remove", "origin")
    uploads = FakeUploads()
    code = prepare_code(Workspace(repo, True), force_upload=force_upload, upload_blob=uploads, warn=lambda m: None)
    assert code == {"kind": "archive", "archive_blob": "blob-1"}
    assert uploads.blobs[0][:2] == b"\x1f\x8b"  # gzip


def test_the_archive_of_the_same_tree_is_the_same_bytes_whatever_the_times_and_modes(
    repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    workspace = Workspace(repo, True)
    make_archive(workspace, tmp_path / "one.tar.gz")
    later = time.time() + 3600
    monkeypatch.setattr(time, "time", lambda: later)  # what gzip would stamp in its header
    os.utime(repo / "train.py", (later, later))
    (repo / "blob.bin").chmod(0o600)  # group/other bits are not kept
    make_archive(workspace, tmp_path / "two.tar.gz")
    assert file_sha256(tmp_path / "one.tar.gz") == file_sha256(tmp_path / "two.tar.gz")
    with tarfile.open(tmp_path / "two.tar.gz") as tar:
        member = tar.getmember("train.py")
        assert (member.mtime, member.uid, member.uname, member.mode) == (0, 0, "", 0o644)
    (repo / "train.py").write_text("print('v3')\n")
    make_archive(workspace, tmp_path / "three.tar.gz")
    assert file_sha256(tmp_path / "three.tar.gz") != file_sha256(tmp_path / "one.tar.gz")


def test_the_archive_keeps_the_executable_bit(repo: Path, tmp_path: Path):
    (repo / "train.py").chmod(0o700)
    make_archive(Workspace(repo, True), tmp_path / "code.tar.gz")
    with tarfile.open(tmp_path / "code.tar.gz") as tar:
        assert tar.getmember("train.py").mode == 0o755


def test_code_digests_describe_what_prepare_code_would_upload(repo: Path, tmp_path: Path):
    digests = code_digests(Workspace(repo, True), force_upload=False, warn=lambda m: None)
    assert digests == {
        "kind": "git",
        "repo_url": str(repo.parent / "origin.git"),
        "commit": head_commit(repo),
        "patch_sha256": hashlib.sha256(git_patch(repo)).hexdigest(),
    }
    uploads = FakeUploads()
    prepare_code(Workspace(repo, True), force_upload=True, upload_blob=uploads, warn=lambda m: None)
    digests = code_digests(Workspace(repo, True), force_upload=True, warn=lambda m: None)
    assert digests == {"kind": "archive", "archive_sha256": hashlib.sha256(uploads.blobs[0]).hexdigest()}


def test_code_digests_of_a_clean_pushed_tree_has_no_patch(repo: Path):
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "all")
    git(repo, "push", "-q", "origin", "main")
    assert "patch_sha256" not in code_digests(Workspace(repo, True), force_upload=False, warn=lambda m: None)
