"""``trainyard run``: plan a workflow's run from the working tree, submit it
and follow it (the sequence is ``submission``'s, shared with ``rerun`` and
``env build``)."""

from __future__ import annotations

import click

from ..devenvs import DevEnvironmentNotice
from ..guard import WARN_ENV
from ..sshclient import default_workspace, entries_of
from . import common, completers, options, submission

SPOT_POLICIES = ["spot", "on-demand", "auto"]


@click.command()
@click.argument("workflow", shell_complete=completers.local_workflows)
@click.argument("run_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- ARGS]")
@options.detach_option
@click.option(
    "-e",
    "--env",
    "env",
    multiple=True,
    metavar="KEY=VALUE",
    callback=lambda ctx, param, pairs: _parse_env(pairs),
    help="Set an environment variable in every job of the run (repeatable); also the value of ${{ variables.KEY }}.",
)
@options.upload_option
@click.option(
    "--no-cache", is_flag=True, help="Run every job, even those an earlier run's artifacts could stand in for."
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Print the plan (jobs, dependencies, resources, cache hits, cheapest offer) and submit nothing.",
)
@options.resources_options
@options.backend_option(overrides=True)
@options.region_option(overrides=True)
@click.option("--spot-policy", type=click.Choice(SPOT_POLICIES), default=None, help="Overrides spot_policy.")
@click.option(
    "--max-price", type=click.FloatRange(min=0, min_open=True), default=None, help="USD per hour; overrides max_price."
)
@click.option(
    "--max-cost",
    metavar="USD",
    default=None,
    help="The most this run may cost, e.g. 20 (wins over the workflow's max_cost; docs/COST.md).",
)
@click.option(
    "--queue",
    is_flag=True,
    help="Over a budget, make the run anyway: its jobs wait for budget instead of the run being refused.",
)
@click.option(
    "--override-budget",
    is_flag=True,
    help="Admins: let this run past the workspace's and your budget (audited; its --max-cost still applies).",
)
@click.option(
    "--code-warn-size",
    metavar="SIZE",
    default=None,
    help=f"Ask before uploading more code than this beyond the commit (default {WARN_ENV} or 20MiB).",
)
@click.option(
    "--open",
    "open_browser",
    is_flag=True,
    help="Open a lab or notebook workflow's Jupyter in the browser once it runs.",
)
@options.yes_option
def run(
    workflow: str,
    run_args: tuple[str, ...],
    detach: bool,
    env: dict[str, str],
    upload: bool,
    no_cache: bool,
    dry_run: bool,
    gpu: str | None,
    cpu: int | None,
    memory: str | None,
    disk: str | None,
    backends: list[str],
    regions: list[str],
    spot_policy: str | None,
    max_price: float | None,
    max_cost: str | None,
    queue: bool,
    override_budget: bool,
    code_warn_size: str | None,
    open_browser: bool,
    yes: bool,
) -> None:
    """Run WORKFLOW from the repo's workflows files and follow it.

    The files: .trainyard/workflows.yaml, .dstack/workflows.yaml and every
    .yaml in .trainyard/workflows/ and .dstack/workflows/ (docs/WORKFLOWS.md).
    The workflows it depends on (deps: - workflow: X) run first, as jobs of
    the same run, unless an earlier run with the same inputs can be reused.
    What follows -- is ${{ run.args }} in the commands. --gpu, --cpu,
    --memory, --disk, --backend, --region, --spot-policy and --max-price
    apply to every job of the run, over what the workflows say. Once
    submitted, the run's dashboard page is printed (View: URL). The code beyond the commit (or the archive) is
    checked before it is uploaded: over --code-warn-size the run lists the
    largest files and asks (not with --yes or without a terminal); over the
    server's limit it is refused. .trainyardignore leaves files out.
    A dev environment (provider lab, notebook or code) runs until stopped or
    idle: once it runs, the run prints the link to its Jupyter (--open opens
    it) or its ssh host and VS Code's code --remote line.
    """
    warn_bytes = submission.warn_size(code_warn_size)
    placement = options.placement(backends, regions, spot_policy, max_price)
    request = submission.RunRequest(
        workflow,
        env,
        list(run_args),
        no_cache,
        placement,
        resources=options.resources(gpu=gpu, cpu=cpu, memory=memory, disk=disk),
        budget=submission.BudgetAsk(max_cost=max_cost, queue=queue, override=override_budget),
    )
    local = submission.plan_locally(request)
    api = common.client()
    created = submission.submit(api, local, upload=upload, warn_bytes=warn_bytes, yes=yes, dry_run=dry_run)
    if created is None:
        return
    jobs = local.plan.jobs
    listed = f" ({len(jobs)} jobs: {', '.join(job.name for job in jobs)})" if len(jobs) > 1 else ""
    notice = DevEnvironmentNotice(
        api.url,
        api.workspace,
        open_browser=open_browser,
        detached=detach,
        host_of=lambda run, job: entries_of(api, run, jobs=[job], default=default_workspace(api))[0].alias,
    )
    submission.follow_submitted(
        api,
        created,
        f"Run {created['name']} submitted{listed}",
        detach=detach,
        on_run=notice,
        before_follow=notice.pending,
    )


def _parse_env(pairs: tuple[str, ...]) -> dict[str, str]:
    env = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not common.ENV_NAME.fullmatch(key):
            raise click.BadParameter(
                f"expected KEY=VALUE with KEY a variable name, got {pair!r}", param_hint="-e/--env"
            )
        env[key] = value
    return env
