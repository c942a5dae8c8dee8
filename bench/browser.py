"""The dashboard in Debian's Chromium, driven by Playwright, for the parts
that time a page (``log-viewer``, the Metrics tab of ``metrics``): every
request signed with the bench's API token; a page visited a few times after
a warm-up visit (it loads the dashboard's assets), each visit timed in the
page by a script of the part's own (Playwright's waits poll at up to 500 ms,
which would be most of what is measured)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from bench.lib import REPO_ROOT, Api

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
# The dashboard the web process serves (without it: a help page, and nothing to wait for).
DASHBOARD = REPO_ROOT / "frontend" / "dist" / "index.html"


def missing() -> str | None:
    """Why no page can be timed here, or None."""
    if not CHROMIUM.exists():
        return f"{CHROMIUM} is missing (apt-get install chromium)"
    if not DASHBOARD.exists():
        return f"the dashboard is not built ({DASHBOARD.relative_to(REPO_ROOT)}): run `make frontend`"
    return None


@contextmanager
def signed_page(api: Api, *, height: int, init_script: str) -> Iterator[tuple[Any, Any]]:
    """(context, page) of a 1280×``height`` Chromium whose every request
    carries the bench's token; ``init_script`` runs in every visit."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            context = browser.new_context(
                viewport={"width": 1280, "height": height},
                base_url=api.url,
                extra_http_headers={"Authorization": f"Bearer {api.token}"},
            )
            context.add_init_script(init_script)
            yield context, context.new_page()
        finally:
            browser.close()


def visits(page: Any, path: str, repeats: int, done: Callable[[Any], float]) -> tuple[float, list[float]]:
    """(the warm-up visit's seconds, the ``repeats`` later ones'): ``done``
    waits for what the part times and returns its ms after the navigation."""
    seconds = []
    for _ in range(repeats + 1):
        page.goto(path)
        seconds.append(done(page) / 1000)
    return seconds[0], seconds[1:]


def heap_bytes(context: Any, page: Any) -> int:
    """The page's JS heap after a garbage collection (CDP)."""
    cdp = context.new_cdp_session(page)
    cdp.send("HeapProfiler.collectGarbage")
    return int(cdp.send("Runtime.getHeapUsage")["usedSize"])


def requests_ms(page: Any, *, prefix: str = "/", query_chars: int = 24) -> list[list[Any]]:
    """The last visit's requests under ``prefix``: [path, start, end] in ms after the navigation started."""
    return list(
        page.evaluate(
            """([prefix, chars]) => performance.getEntriesByType("resource")
  .filter((e) => new URL(e.name).pathname.startsWith(prefix))
  .map((e) => [new URL(e.name).pathname.replace(/[0-9a-f-]{36}/g, "<id>") + new URL(e.name).search.slice(0, chars),
               Math.round(e.startTime), Math.round(e.responseEnd)])""",
            [prefix, query_chars],
        )
    )
