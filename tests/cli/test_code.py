from __future__ import annotations

import hashlib
import os
import subprocess
import tarfile
import time
from pathlib import Path

import pytest
from trainyard.code import (
    ARCHIVE_FILES_NAMED,
    CodeError,
    Shipment,
    ShippedFile,
    Workspace,
    archive_file_digests,
    archive_files,
    code_digests,
    file_sha256,
    find_workspace,
    git_patch,
    head_commit,
    keep_out_of_git,
    make_archive,
    patch_files,
    patch_shipment,
    prepare_code,
)
from trainyard.guard import CodeTooLarge, SizeGuard, parse_size


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


def test_patch_files_name_each_changed_file_and_change_only_with_its_part(repo: Path):
    before = patch_files(git_patch(repo))
    (repo / "new_dir" / "new.py").write_text("print('changed')\n")
    after = patch_files(git_patch(repo))

    assert {"blob.bin", "new_dir/new.py", "old.txt", "staged.txt"} <= set(before)
    assert sorted(p for p in set(before) | set(after) if before.get(p) != after.get(p)) == ["new_dir/new.py"]
    assert patch_files(b"") == {}


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
        "patch_files": patch_files(git_patch(repo)),
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
    files = archive_file_digests(repo, archive_files(Workspace(repo, True)))
    assert code == {"kind": "archive", "archive_blob": "blob-1", "patch_files": files}
    assert uploads.blobs[0][:2] == b"\x1f\x8b"  # gzip


def test_an_archives_file_digests_change_only_with_that_files_bytes_or_mode(repo: Path):
    names = archive_files(Workspace(repo, True))
    before = archive_file_digests(repo, names)
    (repo / "train.py").write_text("print('v3')\n")
    (repo / "blob.bin").chmod(0o700)
    after = archive_file_digests(repo, names)

    assert before is not None and after is not None and set(before) == set(names)
    assert sorted(p for p in names if before[p] != after[p]) == ["blob.bin", "train.py"]
    assert archive_file_digests(repo, ["x"] * (ARCHIVE_FILES_NAMED + 1)) is None  # past the server's limit


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
        "patch_files": patch_files(git_patch(repo)),
    }
    uploads = FakeUploads()
    prepare_code(Workspace(repo, True), force_upload=True, upload_blob=uploads, warn=lambda m: None)
    digests = code_digests(Workspace(repo, True), force_upload=True, warn=lambda m: None)
    assert digests == {
        "kind": "archive",
        "archive_sha256": hashlib.sha256(uploads.blobs[0]).hexdigest(),
        "patch_files": archive_file_digests(repo, archive_files(Workspace(repo, True))),
    }


def test_code_digests_of_a_clean_pushed_tree_has_no_patch(repo: Path):
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "all")
    git(repo, "push", "-q", "origin", "main")
    assert "patch_sha256" not in code_digests(Workspace(repo, True), force_upload=False, warn=lambda m: None)


def test_prepare_code_never_sends_a_credential_in_the_remotes_url_and_says_so(repo: Path):
    git(repo, "remote", "set-url", "origin", "https://ci:ghp_Tok42secret@git.example.test/acme/models.git")
    uploads, warnings = FakeUploads(), []

    code = prepare_code(Workspace(repo, True), force_upload=False, upload_blob=uploads, warn=warnings.append)

    assert code["repo_url"] == "https://git.example.test/acme/models.git"
    assert len(warnings) == 1 and "trainyard repo credential set --https-token" in warnings[0]
    assert "ghp_Tok42secret" not in warnings[0]


# ---------------------------------------------------------------- .trainyardignore


def patched_clone(repo: Path, tmp_path: Path) -> Path:
    """A fresh clone of the commit with ``git_patch(repo)`` applied: what the runner builds."""
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(tmp_path / "origin.git"), str(clone))
    git(clone, "checkout", "-q", head_commit(repo) or "")
    patch = git_patch(repo)
    if patch:
        (tmp_path / "code.patch").write_bytes(patch)
        git(clone, "apply", "--binary", str(tmp_path / "code.patch"))
    return clone


@pytest.mark.parametrize("name", [".trainyardignore", ".dstackignore"])
def test_an_ignore_file_leaves_untracked_files_out_of_the_patch_and_the_archive(repo: Path, tmp_path: Path, name: str):
    (repo / name).write_text("# big things\nblob.bin\nnew_dir/\n")

    shipped = tree_files(patched_clone(repo, tmp_path))
    archived = archive_files(Workspace(repo, True))

    assert sorted(shipped) == sorted([".gitignore", name, "staged.txt", "train.py"])
    assert archived == sorted([".gitignore", name, "staged.txt", "train.py"])


def test_the_ignore_file_keeps_gitignore_and_the_users_global_excludes(repo: Path, tmp_path: Path):
    (tmp_path / "global-ignore").write_text("*.tmp\n")
    git(repo, "config", "--global", "core.excludesFile", str(tmp_path / "global-ignore"))
    (repo / "scratch.tmp").write_text("the user's global excludes say no\n")
    (repo / ".trainyardignore").write_text("blob.bin\n!run.log\n")  # a negation cannot bring back a .gitignore'd file

    assert archive_files(Workspace(repo, True)) == [
        ".gitignore",
        ".trainyardignore",
        "new_dir/new.py",
        "staged.txt",
        "train.py",
    ]
    assert "scratch.tmp" not in tree_files(patched_clone(repo, tmp_path))


def test_the_ignore_file_does_not_hide_changes_to_tracked_files(repo: Path, tmp_path: Path):
    (repo / ".trainyardignore").write_text("train.py\nstaged.txt\n")
    shipped = tree_files(patched_clone(repo, tmp_path))
    assert (shipped["train.py"], shipped["staged.txt"]) == (b"print('v2')\n", b"two\n")


def test_the_ignore_file_outside_git_is_read_with_gitignore_rules(tmp_path: Path):
    root = tmp_path / "plain"
    for name in ("train.py", "data/raw/a.bin", "data/keep.txt", "out/model.pt", "logs/x.log", "logs/keep.log"):
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(name)
    (root / ".trainyardignore").write_text("data/raw/\n/out\n*.log\n!keep.log\n")
    assert archive_files(Workspace(root, False)) == [".trainyardignore", "data/keep.txt", "logs/keep.log", "train.py"]


def test_patch_shipment_lists_the_files_of_the_patch_with_their_sizes(repo: Path):
    (repo / ".trainyardignore").write_text("new_dir/\n")
    shipment = patch_shipment(repo)
    assert shipment.kind == "patch"
    assert shipment.files == (
        ShippedFile(".trainyardignore", 9),
        ShippedFile("blob.bin", 10240),
        ShippedFile("old.txt", 0),  # deleted: its deletion ships
        ShippedFile("staged.txt", 4),
        ShippedFile("train.py", 12),
    )
    assert shipment.total == 10265 and [f.path for f in shipment.largest(2)] == ["blob.bin", "train.py"]


# ---------------------------------------------------------------- the size guard


class Asked:
    def __init__(self, answer: bool) -> None:
        self.answer, self.questions = answer, []

    def __call__(self, question: str) -> bool:
        self.questions.append(question)
        return self.answer


def shipment_of(**sizes: int) -> Shipment:
    return Shipment(kind="patch", files=tuple(ShippedFile(p.replace("_", "/"), n) for p, n in sizes.items()))


def test_the_guard_lets_a_small_upload_through_without_a_word():
    warned, asked = [], Asked(False)
    guard = SizeGuard(warn_bytes=1000, hard_bytes=5000, ask=asked, warn=lambda m, d: warned.append(m))
    guard.before_build(shipment_of(a=600, b=400))
    guard.built(shipment_of(a=600, b=400), 900)
    assert (warned, asked.questions) == ([], [])


def test_over_the_soft_limit_the_guard_lists_the_largest_and_asks():
    warned, asked = [], Asked(False)
    guard = SizeGuard(warn_bytes=1000, hard_bytes=None, ask=asked, warn=lambda m, d: warned.append((m, d)))
    files = {f"f{i}": 100 for i in range(12)} | {"data_big_bin": 3 * 2**20}

    with pytest.raises(CodeError, match="nothing was uploaded and no run was submitted"):
        guard.before_build(shipment_of(**files))

    [(message, details)] = warned
    assert message == (
        "this run uploads 3.0 MiB of uncommitted and untracked files beyond the commit, "
        "more than 1000 B (TRAINYARD_CODE_WARN_SIZE or --code-warn-size)"
    )
    assert details[0] == "  3.0 MiB  data/big/bin"
    assert details[1:10] == [f"    100 B  f{i}" for i in (0, 1, 10, 11, 2, 3, 4, 5, 6)]
    assert details[10:] == [
        "  (and 3 more files, 300 B)",
        "Leave untracked files out by listing them in .trainyardignore at the top of the repo (gitignore syntax), "
        "e.g. `echo '/data/big/bin' >> .trainyardignore`",
    ]
    assert asked.questions == ["Upload 3.0 MiB with this run?"]


def test_without_a_question_the_guard_warns_and_goes_on():
    warned = []
    guard = SizeGuard(warn_bytes=1000, hard_bytes=None, ask=None, warn=lambda m, d: warned.append(m))
    guard.before_build(shipment_of(a=2000))
    assert len(warned) == 1


def test_over_the_hard_limit_the_guard_refuses_before_building_and_before_uploading():
    guard = SizeGuard(warn_bytes=10**9, hard_bytes=1000, ask=Asked(True), warn=lambda m, d: None)
    with pytest.raises(CodeTooLarge) as refused:
        guard.before_build(shipment_of(model_pt=1500))
    assert str(refused.value) == (
        "this run would upload 1.5 KiB of uncommitted and untracked files beyond the commit, "
        "more than the server accepts (1000 B, its TRAINYARD_MAX_BLOB_BYTES); nothing was uploaded"
    )
    assert refused.value.details[0] == "  1.5 KiB  model/pt"

    guard.before_build(shipment_of(model_pt=900))
    with pytest.raises(CodeTooLarge, match=r"this run's patch of 900 B .* is 1.1 KiB, more than the server accepts"):
        guard.built(shipment_of(model_pt=900), 1125)


@pytest.mark.parametrize(
    ("text", "expected"),
    [("20MiB", 20 * 2**20), ("500KB", 500_000), ("1.5 GB", 1_500_000_000), ("1048576", 2**20), ("2m", 2 * 2**20)],
)
def test_sizes_are_read_with_their_units(text: str, expected: int):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "twenty", "20 parsecs", "-1MB"])
def test_a_bad_size_says_what_a_size_looks_like(text: str):
    with pytest.raises(ValueError, match="is not a size: write bytes, or a number with KB, MB, GB, KiB, MiB or GiB"):
        parse_size(text)


# ---------------------------------------------------------------- downloads into the repo


def write_files(root: Path, *names: str) -> list[Path]:
    paths = [root / n for n in names]
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(path.name)
    return paths


def exclude_lines(repo: Path) -> list[str]:
    return (repo / ".git" / "info" / "exclude").read_text().splitlines()


def test_a_download_folder_inside_the_repo_is_excluded_once_and_ships_nothing(repo: Path):
    before = (patch_shipment(repo), git_patch(repo))
    written = write_files(repo / "out", "model/final.json", "data/train.csv")

    first = keep_out_of_git(repo / "out", written)
    again = keep_out_of_git(repo / "out", written)

    assert first == (repo / ".git" / "info" / "exclude", ["/out/"])
    assert again == (repo / ".git" / "info" / "exclude", [])
    assert exclude_lines(repo)[-2:] == ["# written by trainyard (downloads): not part of a run's code", "/out/"]
    assert (patch_shipment(repo), git_patch(repo)) == before


def test_a_download_to_the_top_excludes_each_artifact_folder_and_spares_folders_with_the_users_files(repo: Path):
    written = write_files(repo, "model/final.json", "new_dir/weights.bin", "notes [draft].txt")
    added = keep_out_of_git(repo, written)
    # new_dir/ holds the user's untracked new.py: excluding it would drop that too, so
    # only the downloaded file is excluded there (a folder of tracked files likewise).
    assert added is not None and added[1] == ["/model/", "/new_dir/weights.bin", "/notes \\[draft].txt"]
    assert [f.path for f in patch_shipment(repo).files] == [
        "blob.bin",
        "new_dir/new.py",
        "old.txt",
        "staged.txt",
        "train.py",
    ]


def test_downloads_outside_a_repo_or_already_ignored_add_nothing(repo: Path, tmp_path: Path):
    assert keep_out_of_git(tmp_path / "elsewhere", write_files(tmp_path / "elsewhere", "m.bin")) is None
    assert keep_out_of_git(repo / "data", write_files(repo / "data", "m.bin")) == (
        repo / ".git" / "info" / "exclude",
        [],
    )
