"""An environment's **recipe** (docs/ENVIRONMENTS.md, "The key"): the
platform-free part of its key, a sha256 of the normalised spec and the
digests of the files it names.

The runner computes the same digest from its checkout
(``trainyard_runner.environments.recipe_of``) and reports it with the
environment; the CLI computes the files' digests from the working tree and
sends them with a submission, so the server can say, before anything runs,
whether a job's environment is built already (``--dry-run``) and name a
changed requirements file as the reason a job is not reused.
``tests/runner/test_environments.py`` holds the two to the same answer.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
import re
from collections.abc import Callable, Mapping

# ``-r other.txt`` / ``-c constraints.txt`` inside a requirements file.
_INCLUDE = re.compile(r"^\s*(?:-r|-c|--requirement|--constraint)(?:\s+|=)(\S+)")


def environment_files(requirements: str, read: Callable[[str], bytes | None]) -> dict[str, str]:
    """sha256 of the requirements file and of the files it includes (``-r``
    / ``-c``), by path relative to the repository's root. ``read(path)``
    gives a file's bytes, None when it is missing (left out here: the runner
    says so when it builds)."""
    digests: dict[str, str] = {}
    pending = [posixpath.normpath(requirements)] if requirements else []
    while pending:
        path = pending.pop()
        if path in digests or path == ".." or path.startswith("../"):
            continue
        data = read(path)
        if data is None:
            continue
        digests[path] = hashlib.sha256(data).hexdigest()
        for line in data.decode(errors="replace").splitlines():
            match = _INCLUDE.match(line)
            if match:
                pending.append(posixpath.normpath(posixpath.join(posixpath.dirname(path), match.group(1))))
    return digests


def recipe_of(environment: Mapping[str, object], files: Mapping[str, str]) -> str:
    """The recipe of an ``AssignJob.environment`` (without its ``lock``)
    whose files have ``files``' digests."""
    material = {
        "python": environment.get("python") or "",
        "requirements": environment.get("requirements") or "",
        "pip": list(environment.get("pip") or []),  # type: ignore[call-overload]
        "setup": list(environment.get("setup") or []),  # type: ignore[call-overload]
        "files": dict(sorted(files.items())),
    }
    return hashlib.sha256(json.dumps(material, sort_keys=True, separators=(",", ":")).encode()).hexdigest()
