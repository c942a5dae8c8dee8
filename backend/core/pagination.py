from __future__ import annotations

from typing import Any

from rest_framework import pagination, parsers


class PageNumberPagination(pagination.PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 500


class RawBodyParser(parsers.BaseParser):
    """Leaves the body unread so the view can stream it (uploads)."""

    media_type = "*/*"

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Any = None) -> Any:
        return None
