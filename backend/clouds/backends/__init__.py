"""Cloud backends: one package per backend, same files in each."""

from __future__ import annotations

from backend.clouds.backends.base import Backend


def get_backend(kind: str) -> Backend:
    if kind == "local":
        from backend.clouds.backends.local.backend import LocalBackend

        return LocalBackend()
    raise LookupError(f"backend {kind!r} is not available yet")
