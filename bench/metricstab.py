"""Part ``metrics`` of ``make bench`` (bench/README.md): the run page's
Metrics tab of a seeded 7-day 8-GPU job in Chromium.

Debian's Chromium, driven by Playwright (every request signed with the
bench's API token, as in ``log-viewer``), opens the run page on its Metrics
tab. The time is from the navigation to the animation frame in which the
last chart was painted with its points (uPlot's draw marks the plot with
``data-drawn``; a chart is ``figure.metric-chart`` with ``data-points``),
with nothing changing for SETTLED_MS after; best of TAB_REPEATS after a
warm-up visit (it loads the dashboard's assets). Then the JS heap after a
garbage collection (CDP). Targets (issue 35): ≤ 1 s, ≤ 50 MB.
"""

from __future__ import annotations

from typing import Any

from bench import browser
from bench.lib import Api

TARGET_DRAWN_S = 1.0
TARGET_HEAP_MB = 50.0
TAB_REPEATS = 3
TAB_TIMEOUT_MS = 60_000
SETTLED_MS = 1500  # no chart changed for this long: the page has drawn what it will


def bench_metrics_tab(api: Api, workspace: str, run: str) -> dict[str, Any]:
    """The run page's Metrics tab in Chromium: the time from the navigation
    to the animation frame in which the last chart was painted with its
    points (nothing changing for SETTLED_MS after), best of TAB_REPEATS after a
    warm-up visit; then the JS heap after a garbage collection."""
    if (why := browser.missing()) is not None:
        return {"error": why}
    if not any("metric-chart" in f.read_text(errors="replace") for f in browser.DASHBOARD.parent.rglob("*.js")):
        return {"error": "not measured: the built dashboard (frontend/dist) has no Metrics tab"}

    def drawn(page: Any) -> float:
        page.wait_for_function(_SETTLED_JS, timeout=TAB_TIMEOUT_MS)
        return float(page.evaluate("() => window.__charts.drawnAt"))

    with browser.signed_page(api, height=900, init_script=_DRAWN_JS) as (context, page):
        cold, counted = browser.visits(page, f"/w/{workspace}/runs/{run}?tab=metrics", TAB_REPEATS, drawn)
        shown = page.evaluate("() => window.__charts")
        requests = browser.requests_ms(page, prefix="/api/", query_chars=60)
        heap = browser.heap_bytes(context, page)
    return {
        "drawn_seconds": [round(s, 3) for s in counted],
        "drawn_seconds_best": round(min(counted), 3),
        "cold_seconds": round(cold, 3),
        "charts": shown["charts"],
        "drawn": shown["drawn"],
        "points": shown["points"],
        "heap_mb": round(heap / 1e6, 1),
        "requests_ms": requests,
    }


# In the page: at every animation frame, the charts (``figure.metric-chart``),
# those drawn (uPlot painted its canvas with data: the plot's ``data-drawn``;
# and points), and the time of the last change among them.
_DRAWN_JS = """(() => {
  let seen = "";
  window.__charts = {charts: 0, drawn: 0, points: 0, changedAt: 0, drawnAt: undefined};
  const tick = () => {
    const figures = [...document.querySelectorAll("figure.metric-chart")];
    const drawn = figures.filter((f) => f.querySelector("[data-drawn]") && Number(f.dataset.points || 0) > 0);
    const now = performance.now();
    const state = figures.length + "/" + drawn.map((f) => f.dataset.points).join(",");
    if (state !== seen) {
      seen = state;
      const points = drawn.reduce((sum, f) => sum + Number(f.dataset.points), 0);
      window.__charts = {charts: figures.length, drawn: drawn.length, points, changedAt: now,
                         drawnAt: drawn.length ? now : undefined};
    }
    requestAnimationFrame(tick);
  };
  requestAnimationFrame(tick);
})();"""

_SETTLED_JS = (
    "() => window.__charts && window.__charts.drawnAt !== undefined"
    f" && performance.now() - window.__charts.changedAt > {SETTLED_MS}"
)


def tab_rows(tab: dict[str, Any], row: Any) -> None:
    if "error" in tab:
        row("metrics: Metrics tab of a 7-day 8-GPU job in Chromium", tab["error"][:90], "", False)
        return
    row(
        f"metrics: Metrics tab of a 7-day 8-GPU job in Chromium: charts drawn "
        f"({tab['drawn']} of {tab['charts']} charts, {tab['points']:,} points)",
        f"{tab['drawn_seconds_best']:.2f} s",
        f"≤ {TARGET_DRAWN_S:.0f} s",
        tab["drawn_seconds_best"] <= TARGET_DRAWN_S and tab["drawn"] == tab["charts"] > 0,
    )
    row(
        "  the same page: JS heap after GC",
        f"{tab['heap_mb']:.1f} MB",
        f"≤ {TARGET_HEAP_MB:.0f} MB",
        tab["heap_mb"] <= TARGET_HEAP_MB,
    )
