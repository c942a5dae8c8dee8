"""Backend kinds by import string, and a backend built per account.

A kind's module is imported only when an account of that kind is used, so a
cloud's SDK (boto3 for ``aws``) is loaded only where that cloud is.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from backend.clouds.backends.base import AccountConfig, Compute
from backend.clouds.backends.errors import InvalidConfig

KINDS: Mapping[str, str] = {
    "local": "backend.clouds.backends.local.compute:LocalCompute",
    "fake": "backend.clouds.backends.fake.compute:FakeCompute",
    "aws": "backend.clouds.backends.aws.compute:AwsCompute",
    "self-hosted": "backend.clouds.backends.selfhosted.compute:SelfHostedCompute",
    "kubernetes": "backend.clouds.backends.kubernetes.compute:KubernetesCompute",
}


def compute_for(account: AccountConfig, extra_kinds: Mapping[str, str] | None = None) -> Compute:
    """The backend for ``account``, built from its kind; ``InvalidConfig``
    for an unknown kind or a configuration the backend refuses."""
    return compute_class(account.kind, extra_kinds)(account)


def compute_class(kind: str, extra: Mapping[str, str] | None = None) -> type[Compute]:
    """The ``Compute`` class of ``kind``. ``extra`` adds kinds (or replaces
    built-in ones): ``{"kind": "package.module:ClassName"}``."""
    kinds = {**KINDS, **(extra or {})}
    if kind not in kinds:
        raise InvalidConfig(
            f"unknown backend kind {kind!r}; known kinds: {', '.join(sorted(kinds))}", code="UnknownBackendKind"
        )
    module_name, _, class_name = kinds[kind].partition(":")
    cls = getattr(importlib.import_module(module_name), class_name, None)
    if not (isinstance(cls, type) and issubclass(cls, Compute)) or cls.kind != kind:
        raise TypeError(f"{kinds[kind]} is not a Compute class with kind {kind!r}")
    return cls
