from __future__ import annotations

from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "backend.accounts"
    label = "accounts"

    def ready(self) -> None:
        from backend.accounts import schema  # noqa: F401  (registers the OpenAPI auth scheme)
