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

``-d/--detach``, ``--upload``, ``-y/--yes`` and ``--json`` mean the same on
every command that takes them; ``--json`` prints the API's answer, whose
description (the help) each command gives.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import click
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
