"""Bench part ``log-viewer``: the run page of a finished job of LINES lines in Chromium.

A ``hello`` run finishes; its job's log is then replaced by LINES lines
(``fill_job_log``, as the raw-logs part does). Debian's Chromium, driven by
Playwright, opens the run page (signed with the bench's API token on every
request); the time from the navigation to the log's last line being
visible is taken in the page (``performance.now()`` at the first animation
frame that shows it inside the log's box), best of VIEWER_REPEATS (the
first visit loads the dashboard's assets: a warm-up, not counted). Then the
JS heap after a garbage collection (CDP ``HeapProfiler.collectGarbage`` and
``Runtime.getHeapUsage``), the lines the page holds (the viewer's
``data-held``), the time to scroll to the top until line 1 shows, two
searches through the API, and the heap again once scrolling down from the
top has filled the window to its bound (WINDOW_LINES). The lines are
deleted afterwards.
"""

from __future__ import annotations

import time
from typing import Any

from bench import browser
from bench.lib import Api, log
from tests.support.logfill import NOISY_TEXT, empty_job_log, fill_job_log

VIEWER_REPEATS = 3
VIEWER_TIMEOUT_MS = 120_000
# frontend/src/lib/logwindow.ts WINDOW_LINES: the most lines the page holds per job.
WINDOW_LINES = 20_000
TARGET_VISIBLE_S = 1.0
TARGET_HEAP_MB = 50.0


def bench_log_viewer(api: Api, database_url: str, lines: int) -> dict[str, Any]:
    log(f"(8) log viewer: the run page of a finished job of {lines:,} lines (COPY), in Chromium")
    if (why := browser.missing()) is not None:
        return {"error": why}
    run = api.wait_finished(api.submit("hello")["id"])
    job = run["jobs"][0]["id"]
    fill_job_log(database_url, job, lines)
    try:
        result = _measure(api, f"/w/{api.workspace}/runs/{run['name']}", lines)
        result["search_seconds"] = _search_times(api, job, lines)
    finally:
        empty_job_log(database_url, job)
    log(f"(8) log viewer: {result}")
    return {"run": run["name"], "lines": lines, **result}


def viewer_rows(viewer: dict[str, Any], row: Any) -> None:
    if "error" in viewer:
        row("run page of a long finished job: last line visible", viewer["error"], "", False)
        return
    n = viewer["lines"]
    row(
        f"run page of a finished {n:,}-line job in Chromium: last line visible",
        f"{viewer['visible_seconds_best']:.2f} s",
        f"≤ {TARGET_VISIBLE_S:.0f} s",
        viewer["visible_seconds_best"] <= TARGET_VISIBLE_S,
    )
    row(
        "same page: JS heap after GC",
        f"{viewer['heap_mb']:.1f} MB ({viewer['held_lines']:,} lines held)",
        f"≤ {TARGET_HEAP_MB:.0f} MB",
        viewer["heap_mb"] <= TARGET_HEAP_MB,
    )
    row("same page: scroll to the top until line 1 shows", f"{viewer['top_seconds']:.2f} s", "", None)
    searched = viewer["search_seconds"]
    row(
        "search on the server: a line in the middle / a text that is nowhere",
        f"{searched['middle']:.2f} s / {searched['nowhere']:.2f} s",
        "",
        None,
    )
    row(
        "same page: JS heap after GC, window full",
        f"{viewer['full_window_heap_mb']:.1f} MB ({viewer['full_window_held_lines']:,} lines held)",
        f"≤ {TARGET_HEAP_MB:.0f} MB",
        viewer["full_window_heap_mb"] <= TARGET_HEAP_MB,
    )


def _measure(api: Api, path: str, lines: int) -> dict[str, Any]:
    last_line = f'[role="log"] [data-seq="{lines}"]'

    def shown(page: Any) -> float:
        page.locator(last_line).wait_for(state="visible", timeout=VIEWER_TIMEOUT_MS)
        page.wait_for_function("() => window.__lastLineShownAt !== undefined", timeout=VIEWER_TIMEOUT_MS)
        return float(page.evaluate("() => window.__lastLineShownAt"))

    with browser.signed_page(api, height=800, init_script=_SEEN_JS.replace("SELECTOR", last_line)) as (context, page):
        cold, counted = browser.visits(page, path, VIEWER_REPEATS, shown)
        requests = browser.requests_ms(page)
        heap = browser.heap_bytes(context, page)
        held = int(page.locator('[role="log"]').get_attribute("data-held") or "0")
        started = time.perf_counter()
        page.locator('[role="log"]').evaluate("el => { el.scrollTop = 0; }")
        page.locator('[role="log"] [data-seq="1"]').wait_for(state="visible", timeout=VIEWER_TIMEOUT_MS)
        top = time.perf_counter() - started
        full_held, full_heap = _scrolled_to_the_bound(page, context)
    return {
        "visible_seconds": [round(s, 3) for s in counted],
        "visible_seconds_best": round(min(counted), 3),
        "cold_seconds": round(cold, 3),
        "heap_mb": round(heap / 1e6, 1),
        "held_lines": held,
        "top_seconds": round(top, 3),
        "requests_ms": requests,
        "full_window_heap_mb": round(full_heap / 1e6, 1),
        "full_window_held_lines": full_held,
    }


def _search_times(api: Api, job: str, lines: int) -> dict[str, float]:
    """Seconds of a server search: a line in the middle, forward from line 1,
    and a text that is nowhere (the whole log read)."""
    times = {}
    middle = NOISY_TEXT.format(lines // 2)[:14]
    for name, text in (("middle", middle), ("nowhere", "no such text")):
        started = time.perf_counter()
        api.get(f"/api/v1/workspaces/{api.workspace}/jobs/{job}/logs/", search=text, from_seq=1)
        times[name] = round(time.perf_counter() - started, 2)
    return times


def _scrolled_to_the_bound(page: Any, context: Any) -> tuple[int, float]:
    """Scroll down from the top until the page holds WINDOW_LINES (or stops
    growing): the heap at the most the viewer keeps. (held lines, heap bytes)"""
    log_el = page.locator('[role="log"]')
    held = 0
    # A quarter of a page at a time (the scrollbar is scaled: about 50 lines), so
    # the window grows next to what it holds instead of jumping.
    for _ in range(1_000):
        log_el.evaluate("el => { el.scrollTop += el.clientHeight / 4; }")
        page.wait_for_function("() => !document.querySelector('[data-pending]')", timeout=VIEWER_TIMEOUT_MS)
        held = int(log_el.get_attribute("data-held") or "0")
        if held >= WINDOW_LINES:
            break
    return held, browser.heap_bytes(context, page)


# Sets window.__lastLineShownAt (ms after the navigation started) at the first
# animation frame in which SELECTOR's row lies inside the log's box.
_SEEN_JS = """(() => {
  const tick = () => {
    const row = document.querySelector('SELECTOR');
    const log = document.querySelector('[role="log"]');
    if (row && log) {
      const r = row.getBoundingClientRect();
      const l = log.getBoundingClientRect();
      if (r.height > 0 && r.top >= l.top - 1 && r.bottom <= l.bottom + 1) {
        window.__lastLineShownAt = performance.now();
        return;
      }
    }
    requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
})();"""
