"""Every environment variable is declared once (backend/config/knobs.py), and
what users read agrees with that declaration: .env.example and
docs/CONFIGURATION.md are its output, and docs/PRODUCTION.md and the other documents
that name settings name declared ones. Test hooks are declared apart and
refused in production."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from cryptography.fernet import Fernet

from backend.config import knobs
from backend.core.env import ConfigError

REPO = knobs.CHECKOUT
STALE = f"is not what backend/config/knobs.py declares: regenerate it with `{knobs.REGENERATE}`"

SERVER_KNOBS = [knob for _, topic in knobs.SERVER_TOPICS for knob in knobs.knobs_of(topic)]
TEST_HOOKS = knobs.knobs_of(knobs.TestHooks)
ELSEWHERE = [entry for _, _, entries in knobs.OTHER_PROGRAMS for entry in entries]
DECLARED = {knob.env: knob for knob in SERVER_KNOBS + TEST_HOOKS}
ALL_TOPICS = [topic for _, topic in knobs.SERVER_TOPICS] + [knobs.TestHooks]


@pytest.fixture
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    """No declared variable (nor its ``_FILE``) set: every value is its default."""
    for name in os.environ:
        if name in DECLARED or name.removesuffix("_FILE") in DECLARED:
            monkeypatch.delenv(name)
    return monkeypatch


def read_everything() -> dict[str, Any]:
    """Every topic read in settings.py's order, by variable name."""
    environment = knobs.Environment()
    for topic in (knobs.Mode, knobs.Services, knobs.Web, knobs.Operations, knobs.SignIn, knobs.TrainyardSettings):
        environment.read(topic)
    return environment.values


# ------------------------------------------------------------ the generated files


def test_env_example_agrees_with_the_settings_declaration() -> None:
    assert (REPO / ".env.example").read_text() == knobs.env_example(), f".env.example {STALE}"


def test_the_configuration_table_agrees_with_the_settings_declaration() -> None:
    assert (REPO / "docs/CONFIGURATION.md").read_text() == knobs.markdown(), f"docs/CONFIGURATION.md {STALE}"


def test_the_active_lines_of_env_example_are_the_defaults(clean_environment: pytest.MonkeyPatch) -> None:
    """A copy of .env.example used as it is changes nothing: each line that
    is not commented out spells its variable's default."""
    defaults = read_everything()
    active = {}
    for line in (REPO / ".env.example").read_text().splitlines():
        name, equals, rest = line.partition("=")
        if equals and name in DECLARED:
            active[name] = rest.split(" #")[0].strip()
    assert set(active) == {k.env for k in SERVER_KNOBS if not isinstance(k.default, knobs.Computed)}
    for name, value in active.items():
        clean_environment.setenv(name, value)

    assert read_everything() == defaults


def test_the_production_configuration_section_names_only_declared_variables() -> None:
    production = (REPO / "docs" / "PRODUCTION.md").read_text()
    section = production.split("\n## Configuration for production\n", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"\b(?:TRAINYARD|DJANGO|GITHUB|DATABASE|REDIS)_[A-Z0-9_]*[A-Z0-9]\b", section))
    from_file = {f"{k.env}_FILE" for k in SERVER_KNOBS if k.type.from_file}
    known = set(DECLARED) | from_file | {e.env for e in ELSEWHERE}

    assert "(CONFIGURATION.md)" in section
    assert sorted(named - known) == [], "docs/PRODUCTION.md names variables backend/config/knobs.py does not declare"


def test_the_settings_tables_of_the_other_documents_agree_with_the_declaration() -> None:
    """docs/DEPLOY.md's and docs/RUNS.md's tables of settings: a row names a
    declared variable (after its ``settings.TRAINYARD`` key, if any), and a
    plain number as its default is the declared one."""
    keys = {knob.env: key for topic in ALL_TOPICS for key, _, source in knobs.sources(topic) for knob in source.knobs()}
    wrong = []
    for document in ("docs/DEPLOY.md", "docs/RUNS.md"):
        for row in re.findall(r"^\| (.*) \|$", (REPO / document).read_text(), re.MULTILINE):
            cells = row.split(" | ")
            variables = re.findall(r"`(TRAINYARD_[A-Z0-9_]+)`", cells[0])
            named_keys: list[str] = []
            if not variables and len(cells) > 2:
                variables = re.findall(r"`(TRAINYARD_[A-Z0-9_]+)`", cells[1])
                named_keys = re.findall(r"`([A-Z0-9_]+)`", cells[0])
            if not variables:
                continue
            stated = cells[2 if named_keys else 1].replace("`", "").strip()
            for index, variable in enumerate(variables):
                knob = DECLARED.get(variable)
                if knob is None:
                    wrong.append(f"{document}: {variable} is not declared")
                    continue
                if named_keys and keys[variable] != named_keys[index]:
                    wrong.append(f"{document}: {named_keys[index]} is set by {variable}, declared for {keys[variable]}")
                literal = not isinstance(knob.default, bool) and isinstance(knob.default, int | float)
                if literal and re.fullmatch(r"[\d.]+", stated) and float(stated) != knob.default:
                    wrong.append(f"{document}: {variable} defaults to {knobs.shown(knob.default)}, not {stated}")
    assert wrong == []


# ------------------------------------------------------------ the declaration


def test_every_variable_is_declared_once() -> None:
    names = [k.env for k in SERVER_KNOBS + TEST_HOOKS] + [e.env for e in ELSEWHERE]
    assert sorted(n for n in set(names) if names.count(n) > 1) == []


def test_test_hooks_are_declared_apart_from_production_knobs() -> None:
    assert [k.env for k in TEST_HOOKS if not k.env.startswith("TRAINYARD_TEST_")] == []
    assert [k.env for k in SERVER_KNOBS if k.env.startswith("TRAINYARD_TEST_")] == []


def test_settings_py_reads_the_environment_only_through_the_declaration() -> None:
    source = (REPO / "backend/config/settings.py").read_text()
    assert re.findall(r"\benv_[a-z]+\(|os\.environ|getenv", source) == []


def test_settings_trainyard_is_the_declared_dict() -> None:
    from django.conf import settings

    declared = typing.get_type_hints(knobs.TrainyardSettings)
    assert type(settings.TRAINYARD) is dict
    assert set(settings.TRAINYARD) == set(declared)


def _has_type(value: object, annotation: Any) -> bool:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_has_type(value, arm) for arm in typing.get_args(annotation))
    if annotation is type(None):
        return value is None
    expected = origin or annotation
    return isinstance(value, expected) and not (isinstance(value, bool) and expected in (int, float))


def test_each_default_has_the_declared_type(clean_environment: pytest.MonkeyPatch) -> None:
    environment = knobs.Environment()
    wrong = []
    for topic in (knobs.Mode, knobs.Services, knobs.Web, knobs.Operations, knobs.SignIn, knobs.TrainyardSettings):
        values = environment.read(topic)
        for key, annotation, _ in knobs.sources(topic):
            if not _has_type(values[key], annotation):
                wrong.append(f"{key}: {values[key]!r} is not {annotation}")
    assert wrong == []


def test_a_list_default_is_never_shared(clean_environment: pytest.MonkeyPatch) -> None:
    first = knobs.Environment().read(knobs.Access)
    first["SECRET_KEYS"].append("mutated")

    assert knobs.Environment().read(knobs.Access)["SECRET_KEYS"] == []


def test_a_computed_default_follows_what_it_depends_on(clean_environment: pytest.MonkeyPatch) -> None:
    clean_environment.setenv("TRAINYARD_DATA_DIR", "/srv/trainyard")
    clean_environment.setenv("TRAINYARD_CHANNEL_PREFIX", "acme")
    clean_environment.setenv("TRAINYARD_PORT", "9000")
    clean_environment.setenv("TRAINYARD_ENV", "production")
    environment = knobs.Environment()
    environment.read(knobs.Mode)
    environment.read(knobs.Services)
    web = environment.read(knobs.Web)
    trainyard = environment.read(knobs.TrainyardSettings)

    assert (web["PUBLIC_URL"], web["HTTPS"], web["SECURE_HSTS_SECONDS"]) == ("http://127.0.0.1:9000", True, 31_536_000)
    assert (web["DEBUG"], web["ALLOWED_HOSTS"], trainyard["LOCAL_BACKEND_ENABLED"]) == (False, [], False)
    assert trainyard["STORAGE_DIR"] == Path("/srv/trainyard/storage")
    assert trainyard["RUNNER_WHEELHOUSE"] == Path("/srv/trainyard/runner-wheels")
    assert trainyard["RATE_LIMIT_PREFIX"] == "acme:ratelimit"


def test_every_variable_of_another_program_is_read_by_it() -> None:
    unread = []
    for entry in ELSEWHERE:
        sources = (REPO / entry.read_by).rglob("*.py")
        if not any(entry.env in path.read_text() for path in sources):
            unread.append(f"{entry.env} (not in {entry.read_by})")
    assert unread == []


# ------------------------------------------------------------ test hooks in production


def test_a_set_test_hook_is_refused_in_production_naming_its_variable() -> None:
    trainyard = {key: "" for key in typing.get_type_hints(knobs.TestHooks)}
    knobs.refuse_test_hooks(trainyard)  # all off: nothing to refuse

    for knob, key in zip(TEST_HOOKS, typing.get_type_hints(knobs.TestHooks), strict=True):
        with pytest.raises(ConfigError, match=f"^{knob.env} is a test hook"):
            knobs.refuse_test_hooks({**trainyard, key: "/tmp/hook"})


def test_production_settings_refuse_to_load_with_a_test_hook_set() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "TRAINYARD_"))}
    env.update(
        TRAINYARD_ENV="production",
        DJANGO_SETTINGS_MODULE="backend.config.settings",
        DJANGO_SECRET_KEY="x7!kq" + "Zp3v9Lr2Tn8Wc4Hy6Jb1Md5Fg0Sa" * 2,
        DJANGO_ALLOWED_HOSTS="trainyard.example.com",
        TRAINYARD_PUBLIC_URL="https://trainyard.example.com",
        TRAINYARD_SECRET_KEYS=Fernet.generate_key().decode(),
        TRAINYARD_TEST_CRASH_SUBJECTS="/tmp/crash-subjects",
    )
    load = [sys.executable, "-c", "import django; django.setup()"]
    refused = subprocess.run(load, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)
    del env["TRAINYARD_TEST_CRASH_SUBJECTS"]
    loaded = subprocess.run(load, cwd=REPO, env=env, capture_output=True, text=True, timeout=60)

    assert refused.returncode != 0
    assert "ConfigError: TRAINYARD_TEST_CRASH_SUBJECTS is a test hook" in refused.stderr
    assert loaded.returncode == 0, loaded.stderr
