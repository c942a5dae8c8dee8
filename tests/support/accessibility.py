"""The accessibility audit of the browser tests: axe-core's WCAG 2 A and AA rules.

    serve_axe(context)      # once per browser context (tests/e2e/test_dashboard.py's new_context does it)
    audit(page)             # after each navigation, once the page shows what the test waited for

axe-core is the dashboard's pinned dev dependency (frontend/package.json), so
``make frontend`` (npm ci) puts ``axe.min.js`` where this reads it. It is
injected as a script *from the page's own origin*: the dashboard's
Content-Security-Policy (``script-src 'self'``) refuses inline scripts, and
turning the policy off for the tests would hide what it blocks
(docs/decisions/0045-accessibility-audit.md).
"""

from __future__ import annotations

from typing import Any

from playwright.sync_api import BrowserContext, Page, Route

from tests.support.stack import REPO_ROOT

AXE = REPO_ROOT / "frontend" / "node_modules" / "axe-core" / "axe.min.js"
# Answered by the browser context's route, never by the server.
AXE_PATH = "/__axe-core__/axe.min.js"
WCAG_TAGS = ["wcag2a", "wcag2aa"]
_ELEMENTS_SHOWN = 5  # per rule: 5,000 log rows failing the same way need not be listed

_RUN = """(tags) => axe.run(document, {runOnly: {type: "tag", values: tags}, resultTypes: ["violations"]})"""


def serve_axe(context: BrowserContext) -> None:
    """Make ``AXE_PATH`` on every origin answer with axe-core's script (no request leaves the browser)."""
    if not AXE.is_file():
        raise RuntimeError(f"{AXE} is missing: run `make frontend` (npm ci installs axe-core, a dev dependency)")
    source = AXE.read_bytes()

    def fulfil(route: Route) -> None:
        route.fulfill(status=200, content_type="text/javascript", body=source)

    context.route(f"**{AXE_PATH}", fulfil)


def audit(page: Page) -> None:
    """Fail with each violation (rule, elements, how to fix them) that axe finds on the page as it is now."""
    if not page.evaluate("typeof window.axe !== 'undefined'"):  # a client-side navigation keeps it
        page.add_script_tag(url=AXE_PATH)
    results = page.evaluate(_RUN, WCAG_TAGS)
    violations = results["violations"]
    assert not violations, f"accessibility violations on {page.url}:\n" + describe(violations)


def describe(violations: list[dict[str, Any]]) -> str:
    """One paragraph per rule: its id, impact and help, then each element's selector and axe's fix summary."""
    paragraphs = []
    for violation in violations:
        lines = [f"{violation['id']} ({violation['impact']}): {violation['help']} — {violation['helpUrl']}"]
        nodes = violation["nodes"]
        for node in nodes[:_ELEMENTS_SHOWN]:
            target = " ".join(str(part) for part in node["target"])
            summary = node["failureSummary"].replace("\n", "\n      ")
            lines.append(f"  - {target}\n      {summary}")
        if len(nodes) > _ELEMENTS_SHOWN:
            lines.append(f"  … and {len(nodes) - _ELEMENTS_SHOWN} more elements")
        paragraphs.append("\n".join(lines))
    return "\n".join(paragraphs)
