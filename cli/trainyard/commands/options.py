"""The options several commands take, each defined once, with one meaning
wherever it appears.

``--region REGION``: only machines in these regions. Repeatable or
comma-separated (``--region us-east-1,eu-west-1`` is ``--region us-east-1
--region eu-west-1``); duplicates are dropped. On ``run`` and ``env build``
it overrides the workflows' ``regions`` for every job of the run; on
``offers`` it lists the offers such a run would choose from.
``backend add aws --regions`` is another option: the regions the account
may run machines in, which the server checks when it connects the account.

``--backend KIND``: only backends of these kinds (aws, local, fake,
self-hosted), repeatable or comma-separated like ``--region``; an unknown
kind is refused before anything is sent.

``--gpu``, ``--cpu``, ``--memory``, ``--disk`` (``run``): replace those
``resources:`` keys in every job of the run, written and checked as in the
file (``--gpu A10G:2``, ``--gpu 2``, ``--gpu none`` for no GPU, ``--memory
16GB``).

``-d/--detach``, ``--upload``, ``-y/--yes`` and ``--json`` mean the same on
every command that takes them; ``--json`` prints the API's answer, whose
description (the help) each command gives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import click
from trainyard_spec import ResourceOverrideError, resource_overrides
from trainyard_spec.schema import BACKEND_KINDS

F = TypeVar("F", bound=Callable[..., Any])

detach_option = click.option(
    "-d", "--detach", is_flag=True, help="Submit and return at once; prints the run name last."
)
upload_option = click.option(
    "--upload", is_flag=True, help="Upload the working tree instead of referencing the git remote."
)
yes_option = click.option(
    "-y", "--yes", is_flag=True, help="Upload the code without asking, however large (it still warns)."
)


def resources_options(f: F) -> F:
    """``--gpu``, ``--cpu``, ``--memory``, ``--disk`` (the module's docstring);
    ``resources`` turns their values into the submission's ``resources``."""
    for flag, metavar, example in reversed(RESOURCE_FLAGS):
        f = click.option(
            f"--{flag}",
            flag,
            metavar=metavar,
            type=click.IntRange(min=1) if flag == "cpu" else str,
            default=None,
            help=f"Every job of the run gets this {flag} instead of its workflow's ({example}).",
        )(f)
    return f


RESOURCE_FLAGS = [
    ("gpu", "SPEC", "e.g. A10G, A10G:2, 2, or none for no GPU"),
    ("cpu", "N", "CPU cores, e.g. 8"),
    ("memory", "SIZE", "e.g. 16GB"),
    ("disk", "SIZE", "e.g. 100GB"),
]


def resources(**given: str | int | None) -> dict[str, str | int]:
    """The resources: keys the options give, checked as the workflows file's
    are (a bad one is a usage error naming its option)."""
    values = {k: v for k, v in given.items() if v is not None}
    try:
        resource_overrides(values)
    except ResourceOverrideError as e:
        raise click.BadParameter(f"{e.message}, got {values.get(e.key)!r}", param_hint=f"--{e.key}") from None
    return values


def json_option(help: str) -> Callable[[F], F]:
    """``--json``: print the API's answer (``help`` says which) instead of a table."""
    return click.option("--json", "as_json", is_flag=True, help=help)


def backend_option(*, overrides: bool) -> Callable[[F], F]:
    """``--backend KIND`` (the module's docstring); the value is a list of kinds.
    ``overrides``: the command submits a run, whose workflows' backends it overrides."""
    return _names_option(
        "--backend", "KIND", "backends", example=": aws,local", parse=_backend_kinds, overrides=overrides
    )


def region_option(*, overrides: bool) -> Callable[[F], F]:
    """``--region REGION`` (the module's docstring); the value is a list of regions.
    ``overrides``: the command submits a run, whose workflows' regions it overrides."""
    return _names_option("--region", "REGION", "regions", example="", parse=split_values, overrides=overrides)


def split_values(values: Iterable[str]) -> list[str]:
    """The names in repeated and comma-separated values, each once, in order."""
    return list(dict.fromkeys(part.strip() for value in values for part in value.split(",") if part.strip()))


def placement(
    backends: list[str], regions: list[str], spot_policy: str | None = None, max_price: float | None = None
) -> dict[str, Any]:
    """The placement overrides of a run that the options give (only those given)."""
    values = {"backends": backends, "regions": regions, "spot_policy": spot_policy, "max_price": max_price}
    return {k: v for k, v in values.items() if v not in (None, [])}


def _names_option(
    flag: str,
    metavar: str,
    plural: str,
    *,
    example: str,
    parse: Callable[[tuple[str, ...]], list[str]],
    overrides: bool,
) -> Callable[[F], F]:
    """A repeatable option of names, also comma-separated, given as a list (``parse``'s)."""
    tail = f"; overrides the workflows' {plural}" if overrides else ""
    return click.option(
        flag,
        plural,
        multiple=True,
        metavar=metavar,
        callback=lambda ctx, param, values: parse(values),
        help=f"Only these {plural} (repeatable or comma-separated{example}){tail}.",
    )


def _backend_kinds(values: tuple[str, ...]) -> list[str]:
    kinds = split_values(values)
    unknown = [k for k in kinds if k not in BACKEND_KINDS]
    if unknown:
        raise click.BadParameter(
            f"unknown backend {unknown[0]!r}; known backends: {', '.join(BACKEND_KINDS)}", param_hint="--backend"
        )
    return kinds
