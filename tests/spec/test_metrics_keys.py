"""``metrics:``, ``utilization_policy:`` and ``stall:`` in a workflow: what
they plan to, and every bad value named with its file, line and key."""

from __future__ import annotations

import re
import textwrap

import pytest
from trainyard_runner import protocol
from trainyard_spec import WorkflowFileError, load_workflows_file, resolve_run_plan, schema

PATH = ".trainyard/workflows.yaml"
HEAD = "workflows:\n  - name: a\n    provider: bash\n    commands: [python train.py]\n"


def load(extra: str):
    return load_workflows_file(HEAD + textwrap.indent(textwrap.dedent(extra), "    "), path=PATH)


def errors_of(extra: str) -> list[str]:
    with pytest.raises(WorkflowFileError) as info:
        load(extra)
    return [str(e) for e in info.value.errors]


def test_the_spec_keeps_the_protocols_names_and_bounds():
    assert schema.METRIC_NAME_PATTERN == protocol.METRIC_NAME_PATTERN
    assert schema.SYSTEM_METRIC_PATTERN == protocol.SYSTEM_METRIC_PATTERN
    assert schema.MAX_METRIC_PATTERNS == protocol.MAX_METRIC_PATTERNS
    assert schema.MAX_METRIC_REGEX_CHARS == protocol.MAX_METRIC_REGEX_CHARS
    interval = protocol.AssignJob.model_fields["metrics_interval"].metadata
    per_minute = protocol.AssignJob.model_fields["metrics_per_minute"].metadata
    assert (min(m.ge for m in interval if hasattr(m, "ge")), max(m.le for m in interval if hasattr(m, "le"))) == (
        schema.METRICS_INTERVAL_SECONDS
    )
    assert max(m.le for m in per_minute if hasattr(m, "le")) == schema.METRICS_PER_MINUTE_MAX
    for name in [*protocol.SYSTEM_METRICS, *(f"gpu3.{m}" for m in protocol.GPU_METRICS)]:
        assert re.fullmatch(schema.SYSTEM_METRIC_PATTERN, name)


def test_the_list_form_plans_the_patterns_onto_every_job():
    file = load("metrics: [{name: loss, regex: 'loss ([0-9.]+)'}, {name: train/acc, regex: 'acc=(?P<value>\\S+)'}]")
    (job,) = resolve_run_plan(file, "a", env_overrides={}).jobs
    assert job.metrics == [
        {"name": "loss", "regex": "loss ([0-9.]+)"},
        {"name": "train/acc", "regex": "acc=(?P<value>\\S+)"},
    ]
    assert (job.metrics_interval, job.metrics_per_minute) == (None, None)


def test_the_mapping_form_has_the_interval_in_seconds_and_the_cap():
    file = load("""\
        metrics:
          interval: 1m
          per_minute: 120
          patterns:
            - name: loss
              regex: 'step (?P<step>\\d+) loss (?P<value>[0-9.]+)'
        """)
    (job,) = resolve_run_plan(file, "a", env_overrides={}).jobs
    assert (job.metrics, job.metrics_interval, job.metrics_per_minute) == (
        [{"name": "loss", "regex": "step (?P<step>\\d+) loss (?P<value>[0-9.]+)"}],
        60,
        120,
    )


def test_a_workflow_without_metrics_plans_none():
    (job,) = resolve_run_plan(load(""), "a", env_overrides={}).jobs
    assert (job.metrics, job.metrics_interval, job.metrics_per_minute) == ([], None, None)


METRIC_ERRORS = [
    (
        "metrics: [{name: loss, regex: 'loss ([0-9.]+'}]",
        5,
        "metrics[0].regex: the regex does not compile: missing ), unterminated subpattern at position 5",
    ),
    (
        "metrics: [{name: loss, regex: 'loss [0-9.]+'}]",
        5,
        "metrics[0].regex: the regex has no group for the value: put it in parentheses, e.g. 'loss ([0-9.eE+-]+)', "
        "or name it (?P<value>...)",
    ),
    (
        "metrics: [{name: loss, regex: 'step (?P<step>\\d+)'}]",
        5,
        "metrics[0].regex: the regex's only group is 'step': add a group for the value, e.g. (?P<value>[0-9.]+)",
    ),
    (
        "metrics: [{name: cpu, regex: 'cpu ([0-9.]+)'}]",
        5,
        "metrics[0].name: 'cpu' is a system metric's name (cpu, memory, disk_used, disk_total, net_rx, net_tx, "
        "gpu<N>.<metric>): give the training metric another, e.g. train/cpu",
    ),
    (
        "metrics: [{name: gpu0.util, regex: 'u ([0-9.]+)'}]",
        5,
        "metrics[0].name: 'gpu0.util' is a system metric's name (cpu, memory, disk_used, disk_total, net_rx, net_tx, "
        "gpu<N>.<metric>): give the training metric another, e.g. train/gpu0.util",
    ),
    (
        "metrics: [{name: 1st, regex: 'x ([0-9.]+)'}]",
        5,
        "metrics[0].name: a metric name is letters, digits, '_', '.', '/' and '-', starting with a letter or '_' "
        "(at most 64 characters), got '1st'",
    ),
    (
        "metrics:\n  - {name: loss, regex: 'loss ([0-9.]+)'}\n  - {name: loss, regex: 'l=([0-9.]+)'}",
        7,
        "metrics[1].name: metric 'loss' is declared twice (first as item 0): give each pattern a name of its own",
    ),
    (
        "metrics:\n  patterns:\n    - {name: loss, regex: 'loss ([0-9.]+)'}\n    - {name: loss, regex: 'l=(\\S+)'}",
        8,
        "metrics.patterns[1].name: metric 'loss' is declared twice (first as item 0): give each pattern a name of "
        "its own",
    ),
    ("metrics: {interval: 2h}", 5, "metrics.interval: the sampling interval is from 1s to 3600s, got the number 7200"),
    ("metrics: {per_minute: 0}", 5, "metrics.per_minute: must be at least 1, got the number 0"),
    ("metrics: {intervall: 5s}", 5, "metrics.intervall: unknown key 'intervall'; did you mean 'interval'?"),
    ("metrics: [{name: loss}]", 5, "metrics[0].regex: missing required key 'regex'"),
    (
        "utilization_policy: {min_gpu_utilization: 10}",
        5,
        "utilization_policy.time_window: missing required key 'time_window'",
    ),
    (
        "utilization_policy: {min_gpu_utilization: 0, time_window: 30m}",
        5,
        "utilization_policy.min_gpu_utilization: must be at least 1, got the number 0",
    ),
    (
        "utilization_policy: {min_gpu_utilization: 101, time_window: 30m}",
        5,
        "utilization_policy.min_gpu_utilization: must be at most 100, got the number 101",
    ),
    (
        "utilization_policy: {min_gpu_utilization: 10, time_window: soon}",
        5,
        "utilization_policy.time_window: expected a duration such as 30m, 2h or 1d (or off), got 'soon'",
    ),
    ("stall: {timeout: 20m, action: kill}", 5, "stall.action: expected one of 'stop' or 'restart', got 'kill'"),
    ("stall: {timeout: 20m, acton: stop}", 5, "stall.acton: unknown key 'acton'; did you mean 'action'?"),
    ("stall: 20m", 5, "stall: expected a mapping, got '20m'"),
    (
        "stall: {timeout: off}",
        5,
        "stall.timeout: write a duration such as 30m here (to turn the guard off, write off as its whole value, "
        "e.g. stall: off)",
    ),
    ("stall: {timeout: 0}", 5, "stall.timeout: a duration of 0 means no time at all: write e.g. 30m, or off"),
]


@pytest.mark.parametrize(("extra", "line", "error"), METRIC_ERRORS)
def test_a_bad_metrics_or_guard_value_is_named_with_its_file_line_and_key(extra: str, line: int, error: str):
    assert errors_of(extra) == [f"{PATH}:{line}: workflows[0] (a).{error}"]


def test_guards_are_stored_in_seconds_and_off_is_kept_to_turn_the_workspaces_default_off():
    file = load("""\
        utilization_policy: {min_gpu_utilization: 10, time_window: 30m}
        stall: {timeout: 20m, action: restart}
        """)
    assert file.get("a").guards() == {
        "utilization_policy": {"min_gpu_utilization": 10, "time_window": 1800},
        "stall": {"timeout": 1200, "action": "restart"},
    }
    assert load("stall: {timeout: 90s}").get("a").guards() == {"stall": {"timeout": 90, "action": "stop"}}
    assert load("utilization_policy: off\nstall: off").get("a").guards() == {
        "utilization_policy": "off",
        "stall": "off",
    }
    assert load("").get("a").guards() == {}


def test_the_new_retry_events_are_known():
    file = load("retry: {on_events: [stalled, low-gpu-utilization]}")
    assert file.get("a").retry.on_events == ["stalled", "low_gpu_utilization"]


def test_a_dstack_file_with_the_new_keys_loads_from_the_dstack_path():
    text = HEAD + "    metrics: [{name: loss, regex: 'loss ([0-9.]+)'}]\n    stall: {timeout: 20m}\n"
    file = load_workflows_file(text, path=".dstack/workflows.yaml")
    assert file.get("a").guards() == {"stall": {"timeout": 1200, "action": "stop"}}
