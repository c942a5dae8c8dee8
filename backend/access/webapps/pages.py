"""The few pages the apps origin answers itself: what went wrong, what to do.

Plain HTML, no script or style from elsewhere; every value escaped."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from html import escape
from typing import Any

Send = Callable[[dict[str, Any]], Awaitable[None]]


@dataclass(frozen=True)
class Page:
    title: str
    text: str


def not_listening(label: str, why: str) -> Page:
    return Page(
        "Nothing is listening",
        f"Nothing is listening on {label}, or it did not answer ({why}). "
        "Start the app in the job (it must listen on that port on 127.0.0.1 or 0.0.0.0), then reload.",
    )


def too_large(label: str, cap: int) -> Page:
    return Page("Request too large", f"A request to {label} may carry at most {cap // 1024**2} MiB.")


def refused(text: str) -> Page:
    return Page("Not allowed", text)


def no_pass() -> Page:
    return Page(
        "Open this app from Trainyard",
        "This app opens only from the Trainyard dashboard: on the job's page, choose Open next to the port.",
    )


def code_spent(seconds: int) -> Page:
    return Page(
        "This link has expired",
        f"A link that opens an app works once, within {seconds} seconds. "
        "Open the app again from the job's page on the Trainyard dashboard.",
    )


def no_such_app() -> Page:
    return Page(
        "No such app",
        "There is no app at this address. Open it again from the job's page on the Trainyard dashboard.",
    )


def html(page: Page) -> bytes:
    return (
        "<!doctype html><html lang=en><meta charset=utf-8>"
        f"<title>{escape(page.title)}</title><h1>{escape(page.title)}</h1><p>{escape(page.text)}</p></html>"
    ).encode()


async def send_page(send: Send, status: int, page: Page, *, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = html(page)
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/html; charset=utf-8"),
                (b"content-length", str(len(body)).encode()),
                (b"cache-control", b"no-store"),
                (b"content-security-policy", b"default-src 'none'"),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body, "more_body": False})
