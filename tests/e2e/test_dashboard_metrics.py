"""The run page's Metrics tab and the Compare page (docs/METRICS.md) in headless
Chromium against the real stack, signed in through the local GitHub stand-in.

A job appends ``{"step", "loss"}`` lines to ``$TRAINYARD_METRICS_FILE`` once
a second: while it runs, the Metrics tab draws its loss curve on the canvas
and new points appear without a reload (the tab reads the points since the
newest one it holds), next to its CPU and memory charts. Three runs of one
workflow with different ``-e LR`` are ticked on the runs list and compared:
one chart overlays their three curves, and a table puts their final loss,
their ``-e`` values, commit and cost side by side. The Metrics tab of a
seeded 7-day, 8-GPU job (minute blocks written through backend.metrics'
own block format) draws with under 50 MB of JS heap, and the page's own
time (from the click to the last chart drawn, less the server's time
answering the series) is under a second; the test prints both.
Each page passes the accessibility audit and breaks no rule of the
Content-Security-Policy. Screenshots go to ``test-artifacts/screenshots/``.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from pathlib import Path

from playwright.sync_api import Browser, BrowserContext, Locator, Page, expect

from tests.e2e.conftest import FINISHED, User, commit_all, make_repo, run_name_of
from tests.e2e.test_dashboard import make_token, new_context, screenshot, sign_in
from tests.support.accessibility import audit
from tests.support.github import GithubServer, GithubUser
from tests.support.stack import Stack

# People of this file's own on the shared stack (tests/core/test_parallel_workers.py).
NORA = GithubUser(id=5351, login="nora", name="Nora Quinn")
OTTO = GithubUser(id=5352, login="otto", name="Otto Brandt")
PIA = GithubUser(id=5353, login="pia", name="Pia Lund")

CURVE_PY = """\
import json, os, time

steps = int(os.environ.get("STEPS", "60"))
lr = float(os.environ.get("LR", "0.1"))
pause = float(os.environ.get("STEP_SECONDS", "1"))
for step in range(1, steps + 1):
    loss = round((1 + 10 * lr) * 2.0 / (step + 1), 5)
    with open(os.environ["TRAINYARD_METRICS_FILE"], "a") as out:
        out.write(json.dumps({"step": step, "loss": loss}) + "\\n")
    print(f"step {step} loss {loss}", flush=True)
    time.sleep(pause)
"""

WORKFLOWS = """\
workflows:
  - name: curve
    provider: bash
    commands:
      - python3 curve.py

  - name: sweep
    provider: bash
    env:
      - STEPS=6
      - STEP_SECONDS=0.2
    commands:
      - python3 curve.py
"""

CSP_WATCH = (
    "window.__cspViolations = [];"
    "document.addEventListener('securitypolicyviolation',"
    " (e) => window.__cspViolations.push(`${e.violatedDirective} ${e.blockedURI}`));"
)
# The first line colour of lib/metrics.ts's PALETTE: a training chart's curve, the first compared run.
LINE_COLOURS = ["#4e79a7", "#f28e2b", "#e15759"]


def curve_repo(tmp_path: Path) -> Path:
    repo = make_repo(tmp_path / "curves")
    (repo / ".trainyard" / "workflows.yaml").write_text(WORKFLOWS)
    (repo / "curve.py").write_text(CURVE_PY)
    commit_all(repo, "curves")
    return repo


def signed_in(
    browser: Browser,
    contexts: list[BrowserContext],
    stack: Stack,
    github: GithubServer,
    who: GithubUser,
    token_name: str = "metrics",
) -> tuple[Page, User]:
    """``who`` signed in through GitHub in a context of its own (watched for
    CSP violations), with an API token named ``token_name`` made on the page."""
    context = new_context(browser, stack)
    context.add_init_script(CSP_WATCH)
    contexts.append(context)
    page = context.new_page()
    sign_in(page, github, who)
    return page, User(who.login, make_token(page, token_name), stack)


def chart(page: Page, title: str) -> Locator:
    return page.get_by_role("figure", name=f"{title} chart")


def points_of(figure: Locator) -> int:
    return int(figure.get_attribute("data-points") or 0)


def painted(figure: Locator, colour: str) -> int:
    """Pixels of ``colour`` on the chart's canvas: the line uPlot drew."""
    return figure.locator("canvas").evaluate(
        """(canvas, hex) => {
            const [r, g, b] = [1, 3, 5].map((i) => parseInt(hex.slice(i, i + 2), 16));
            const data = canvas.getContext("2d").getImageData(0, 0, canvas.width, canvas.height).data;
            let n = 0;
            for (let i = 0; i < data.length; i += 4) {
              if (Math.abs(data[i] - r) < 24 && Math.abs(data[i + 1] - g) < 24 && Math.abs(data[i + 2] - b) < 24 && data[i + 3] > 160) n += 1;
            }
            return n;
        }""",
        colour,
    )


def no_csp_violations(page: Page) -> None:
    assert page.evaluate("window.__cspViolations") == []


def test_the_metrics_tab_draws_a_live_curve_while_the_job_runs(
    stack: Stack, stack_github: GithubServer, browser: Browser, contexts: list[BrowserContext], tmp_path: Path
) -> None:
    page, nora = signed_in(browser, contexts, stack, stack_github, NORA)
    submitted = nora.cli(curve_repo(tmp_path), "run", "curve", "-d", "-e", "STEPS=90")
    assert submitted.returncode == 0, submitted.stderr
    name = run_name_of(submitted)
    nora.wait(name, lambda run: run["status"] == "running", timeout=120)

    page.goto(f"/w/{nora.workspace}/runs/{name}?tab=metrics")
    expect(page.get_by_role("tab", name="Metrics")).to_have_attribute("aria-selected", "true")
    loss = chart(page, "loss")
    expect(loss).to_have_attribute("data-points", re.compile(r"^([3-9]|\d\d+)$"), timeout=60_000)
    first = points_of(loss)
    first_value = loss.locator(".metric-legend-value").inner_text()
    # New points appear while the job runs, without a reload.
    deadline = time.monotonic() + 30
    while points_of(loss) < first + 3 and time.monotonic() < deadline:
        page.wait_for_timeout(500)
    assert points_of(loss) >= first + 3, f"the loss chart stayed at {points_of(loss)} points (from {first})"
    assert nora.run(name)["status"] == "running", "the points should arrive while the job still runs"
    assert loss.locator(".metric-legend-value").inner_text() != first_value
    expect(loss.locator(".metric-chart-plot")).to_have_attribute("data-drawn", re.compile(r"^\d+$"))
    assert painted(loss, LINE_COLOURS[0]) > 50, "no loss curve on the canvas"

    cpu = chart(page, "CPU (% of one core)")
    expect(cpu).to_have_attribute("data-points", re.compile(r"^[1-9]\d*$"))
    expect(chart(page, "Memory (resident)")).to_be_visible()
    expect(page.get_by_role("list", name="Attempts")).to_contain_text("Attempt 1")
    expect(page.locator(".metrics-live")).to_contain_text("Live")
    audit(page)
    screenshot(page, "metrics-live")
    no_csp_violations(page)

    stopped = nora.api("POST", f"/api/v1/workspaces/{nora.workspace}/runs/{nora.run(name)['id']}/stop/")
    assert stopped.status_code == 202, stopped.text
    nora.wait(name, lambda run: run["status"] in FINISHED, timeout=60)
    expect(page.locator(".metrics-live")).to_contain_text("Final", timeout=30_000)


def test_three_runs_of_a_workflow_are_compared_side_by_side(
    stack: Stack, stack_github: GithubServer, browser: Browser, contexts: list[BrowserContext], tmp_path: Path
) -> None:
    page, otto = signed_in(browser, contexts, stack, stack_github, OTTO)
    repo = curve_repo(tmp_path)
    rates = ["0.3", "0.1", "0.01"]
    names = []
    for lr in rates:
        submitted = otto.cli(repo, "run", "sweep", "-d", "-e", f"LR={lr}")
        assert submitted.returncode == 0, submitted.stderr
        names.append(run_name_of(submitted))
    for name in names:
        assert otto.wait(name, lambda run: run["status"] in FINISHED, timeout=180)["status"] == "succeeded"

    # What the server answers, so a failure below says whether it is the page or the data.
    answer = otto.api("GET", f"/api/v1/workspaces/{otto.workspace}/metrics/compare/?runs={','.join(names)}")
    assert answer.status_code == 200, answer.text
    for compared in answer.json()["runs"]:
        losses = [s for s in compared["series"] if s["name"] == "loss"]
        assert len(losses) == 1 and losses[0]["points"]["x"] == [1, 2, 3, 4, 5, 6], compared

    page.goto(f"/w/{otto.workspace}/runs")
    for name in names:
        page.get_by_role("checkbox", name=f"Compare {name}").check()
    bar = page.get_by_role("group", name="Compare runs")
    expect(bar).to_contain_text("3 runs of sweep picked")
    audit(page)
    bar.get_by_role("button", name="Compare 3 runs").click()
    expect(page.get_by_role("heading", name="Compare runs")).to_be_visible()
    assert page.url.endswith("/compare?runs=" + ",".join(names))

    table = page.get_by_role("table", name="Compared runs")
    expect(table.get_by_role("columnheader")).to_have_count(4)
    # -e values are secrets: a digest each, different for different values.
    lr_row = table.get_by_role("row").filter(has=page.get_by_role("rowheader", name="-e LR", exact=True))
    expect(lr_row.get_by_role("cell")).to_have_text([re.compile(r"^sha:[0-9a-f]{8}$")] * 3)
    assert len(set(lr_row.get_by_role("cell").all_inner_texts())) == 3
    loss_row = table.get_by_role("row").filter(has=page.get_by_role("rowheader", name="loss", exact=True))
    # The final loss (step 6), in the page's four significant digits.
    expect(loss_row.get_by_role("cell")).to_have_text(
        [str(float(f"{(1 + 10 * float(lr)) * 2.0 / 7:.4g}")) for lr in rates]
    )
    commit_row = table.get_by_role("row").filter(has=page.get_by_role("rowheader", name="Commit", exact=True))
    expect(commit_row.get_by_role("cell")).to_have_count(3)
    expect(table.get_by_role("rowheader", name="Cost", exact=True)).to_be_visible()

    loss = chart(page, "loss")
    expect(loss).to_have_attribute("data-points", "18")
    expect(loss.locator("[data-line]")).to_have_count(3)
    expect(loss.locator(".metric-chart-plot")).to_have_attribute("data-drawn", re.compile(r"^\d+$"))
    for colour in LINE_COLOURS:
        assert painted(loss, colour) > 30, f"no curve of colour {colour} on the compare chart"
    audit(page)
    screenshot(page, "metrics-compare")
    no_csp_violations(page)


# --- a week-long 8-GPU job, seeded ---------------------------------------------------

DAYS = 7
GPUS = 8


def _seed_week(stack: Stack, user: User, run_name: str) -> None:
    """The finished job of ``run_name`` becomes a 7-day job on 8 GPUs: its
    attempt spans the week, with one block of per-minute min/mean/max per hour
    (what compaction leaves of 5-second samples) and a loss value every 10 min."""
    import psycopg

    from backend.metrics.blocks import Minutes, Values

    run = user.run(run_name)
    job_id = run["jobs"][0]["id"]
    end = math.floor(time.time() / 3600) * 3600.0
    start = end - DAYS * 86400
    names = ["cpu", "memory", "disk_used", "disk_total", "net_rx", "net_tx"] + [
        f"gpu{g}.{m}" for g in range(GPUS) for m in ("util", "memory", "memory_total", "power", "temperature")
    ]
    with psycopg.connect(stack.database_url) as conn:
        attempt_id = conn.execute(
            "SELECT id FROM runs_attempt WHERE job_id = %s ORDER BY number LIMIT 1", (uuid.UUID(job_id),)
        ).fetchone()[0]
        conn.execute("DELETE FROM metrics_systemblock WHERE job_id = %s", (uuid.UUID(job_id),))
        conn.execute("DELETE FROM metrics_trainingblock WHERE job_id = %s", (uuid.UUID(job_id),))
        for hour in range(DAYS * 24):
            bucket = start + hour * 3600
            block = Minutes()
            for minute in range(60):
                t = bucket + minute * 60
                block.t.append(t)
                block.count.append(12)
                for name in names:
                    mean = _value(name, t)
                    block.low.setdefault(name, []).append(mean * 0.9)
                    block.mean.setdefault(name, []).append(mean)
                    block.high.setdefault(name, []).append(mean * 1.05)
            conn.execute(
                "INSERT INTO metrics_systemblock (attempt_id, job_id, number, level, bucket, t_first, t_last, count, names, data, created_at)"
                " VALUES (%s, %s, 1, 2, to_timestamp(%s), to_timestamp(%s), to_timestamp(%s), 60, %s, %s, now())",
                (attempt_id, uuid.UUID(job_id), bucket, bucket, bucket + 3540, json.dumps(names), block.encode()),
            )
        steps = list(range(0, DAYS * 144))
        values = Values(
            t=[start + s * 600 for s in steps],
            step=[s * 100 for s in steps],
            v=[3 * math.exp(-s / 300) + 0.1 for s in steps],
        )
        conn.execute(
            "INSERT INTO metrics_trainingblock (attempt_id, job_id, number, name, by_step, packed, count, t_first, t_last, data, created_at)"
            " VALUES (%s, %s, 1, 'loss', true, true, %s, to_timestamp(%s), to_timestamp(%s), %s, now())",
            (attempt_id, uuid.UUID(job_id), len(steps), values.t[0], values.t[-1], values.encode()),
        )
        conn.execute(
            "UPDATE runs_attempt SET started_at = to_timestamp(%s), finished_at = to_timestamp(%s) WHERE id = %s",
            (start, end, attempt_id),
        )
        conn.execute(
            "INSERT INTO metrics_attemptmetrics (attempt_id, job_id, number, dropped, malformed, frames_dropped, repeated,"
            " system_names, training_names, last, marks, updated_at) VALUES (%s, %s, 1, 0, 0, 0, 0, %s, %s, '{}', '{}', now())"
            " ON CONFLICT (attempt_id) DO UPDATE SET system_names = EXCLUDED.system_names, training_names = EXCLUDED.training_names",
            (attempt_id, uuid.UUID(job_id), json.dumps(names), json.dumps(["loss"])),
        )


def _value(name: str, t: float) -> float:
    phase = t / 3600
    if name == "cpu":
        return 90 + 8 * math.sin(phase)
    if name == "memory":
        return 24e9
    if name == "disk_used":
        return 400e9
    if name == "disk_total":
        return 1e12
    if name.startswith("net_"):
        return 5e6 + 2e6 * math.sin(phase * 3)
    gpu = int(name[3 : name.index(".")])
    metric = name.split(".", 1)[1]
    return {
        "util": 85 + 10 * math.sin(phase + gpu),
        "memory": 70e9,
        "memory_total": 80e9,
        "power": 600 + 50 * math.sin(phase + gpu),
        "temperature": 70 + gpu,
    }[metric]


def test_the_metrics_tab_of_a_week_long_eight_gpu_job_draws_within_a_second_of_its_own(
    stack: Stack, stack_github: GithubServer, browser: Browser, contexts: list[BrowserContext], tmp_path: Path
) -> None:
    page, pia = signed_in(browser, contexts, stack, stack_github, PIA)
    submitted = pia.cli(curve_repo(tmp_path), "run", "sweep", "-d")
    assert submitted.returncode == 0, submitted.stderr
    name = run_name_of(submitted)
    assert pia.wait(name, lambda run: run["status"] in FINISHED, timeout=180)["status"] == "succeeded"
    _seed_week(stack, pia, name)

    page.goto(f"/w/{pia.workspace}/runs/{name}")
    expect(page.get_by_role("tab", name="Metrics")).to_be_visible()
    cdp = page.context.new_cdp_session(page)
    cdp.send("HeapProfiler.enable")
    started = page.evaluate("performance.now()")
    page.get_by_role("tab", name="Metrics").click()
    charts = page.locator(".metric-chart-plot")
    expect(charts).to_have_count(9)  # loss, CPU, memory, GPU util, memory, power, temperature, disk, network
    page.wait_for_function(
        "() => [...document.querySelectorAll('.metric-chart-plot')].every((el) => el.dataset.drawn)", timeout=30_000
    )
    drawn = page.evaluate("performance.now()") - started
    cdp.send("HeapProfiler.collectGarbage")
    heap = cdp.send("Runtime.getHeapUsage")["usedSize"]
    series = page.evaluate(
        "performance.getEntriesByType('resource').filter((e) => e.name.includes('/metrics/series/'))"
        ".map((e) => ({start: e.startTime, server: e.responseStart - e.requestStart, bytes: e.encodedBodySize}))"
    )
    assert len(series) == 1, series
    # The page's own time: from the click to the last chart drawn, less the server's time answering the series.
    own = drawn - series[0]["server"]
    print(
        f"week-long 8-GPU job: charts drawn {drawn:.0f} ms after the click; the server answered the series"
        f" ({series[0]['bytes'] / 2**20:.1f} MB) in {series[0]['server']:.0f} ms: the page's own {own:.0f} ms;"
        f" JS heap {heap / 2**20:.1f} MB"
    )
    util = chart(page, "GPU utilisation")
    expect(util.locator("[data-line]")).to_have_count(GPUS)
    assert points_of(util) >= 8 * 500, "the week should come back downsampled, not as a handful of points"
    screenshot(page, "metrics-week-8gpu")
    assert own <= 1000, f"the Metrics tab took {own:.0f} ms of its own to draw"
    assert heap <= 50 * 2**20, f"the page holds {heap / 2**20:.1f} MB of JS heap"
