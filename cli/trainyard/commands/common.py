"""What every command module shares: the error a command raises, the click
group that turns the SDK's exceptions into it, the API client, following a
run, and the little readers and messages of the terminal.

The rule: a command never prints a traceback. It raises ``CliError`` (or an
exception ``Group`` turns into one), shown as ``error: message`` plus detail
lines on stderr, exit code 1; warnings go to stderr as ``warning: …``.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TypeVar
from urllib.parse import quote

import click

from ..api import ApiError, Client, Job, Me, Run
from ..config import ConfigError, load_config
from ..proxy import ProxyError
from ..sshclient import SshClientError
from ..sshconfig import SshConfigError
from ..sshkeys import SshKeyError

if TYPE_CHECKING:
    from trainyard_spec import Source, WorkflowsFile

# The workflow parser, the code packer and the log follower are imported
# where they are used: ``trainyard ssh`` (started for every connection) needs
# none of them, and they are most of what importing every command costs.

T = TypeVar("T")

# An environment variable's name: what -e KEY=VALUE and a secret's name must be.
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


class CliError(click.ClickException):
    """An error shown as ``error: message`` plus detail lines, exit code 1."""

    def __init__(self, message: str, details: list[str] | None = None) -> None:
        super().__init__(message)
        self.details = details or []

    def show(self, file: Any = None) -> None:
        lines = [f"error: {self.message}"] if self.message else []
        click.echo("\n".join([*lines, *self.details]), err=True)


class Group(click.Group):
    """Turns the SDK's exceptions into CliError: a message, never a traceback.
    ``aliases``: other names of its commands ({alias: name}), not listed in its help."""

    def __init__(self, *args: Any, aliases: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.aliases = aliases or {}

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        return super().get_command(ctx, self.aliases.get(cmd_name, cmd_name))

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except Exception as e:
            error = _cli_error(e)
            if error is None:
                raise
            raise error from None


def _cli_error(e: Exception) -> CliError | None:
    """What a person is told of the SDK's exception ``e`` (None: not one of them)."""
    from trainyard_spec import WorkflowFileError

    from ..code import CodeError
    from ..guard import CodeTooLarge

    if isinstance(e, WorkflowFileError):
        return CliError("", [str(err) for err in e.errors])
    if isinstance(e, ApiError):
        return CliError(e.message, [_format_server_error(err) for err in e.errors])
    if isinstance(e, CodeTooLarge):
        return CliError(str(e), e.details)
    if isinstance(e, (ConfigError, CodeError, SshKeyError, SshConfigError, SshClientError, ProxyError)):
        return CliError(str(e))
    return None


def client() -> Client:
    """The API client of the configured server, token and workspace
    (``trainyard.config``); tests replace this function."""
    config = load_config()
    return Client(config.url, config.require_token(), config.workspace)


def run_url(api: Client, run_name: str) -> str:
    """The run's page on the dashboard, which the server serves beside its API."""
    return f"{api.url.rstrip('/')}/w/{quote(api.workspace, safe='')}/runs/{quote(run_name, safe='')}"


def follow(
    api: Client,
    run_name: str,
    *,
    seen: dict[str, int],
    on_reused: Callable[[Job], None] = lambda job: None,
    announced: set[str] | None = None,
    on_run: Callable[[Run], None] = lambda run: None,
    only: set[str] | None = None,
    timestamps: bool = False,
) -> Run:
    """Follow a run to its end; Ctrl-C detaches with exit code 130.
    ``on_run`` gets every update of the run, after the status line;
    ``only``: the job ids whose lines are printed (None: every job's);
    ``timestamps``: each line starts with its UTC time."""
    from ..follow import Follower
    from ..output import LogWriter, StatusDisplay

    display = StatusDisplay(live=sys.stdout.isatty() and sys.stderr.isatty())

    def updated(run: Run) -> None:
        display.update(run)
        on_run(run)

    follower = Follower(
        api,
        run_name,
        writer=LogWriter(),
        on_run=updated,
        before_logs=display.pause,
        seen=seen,
        on_reused=on_reused,
        announced=announced,
        only=only,
        timestamps=timestamps,
    )
    try:
        return follower.follow()
    except KeyboardInterrupt:
        display.pause()
        _detach(run_name)
    finally:
        display.pause()


def workflow_sources(root: Path) -> list[Source]:
    """The repo's workflows files, as the server is sent them."""
    from trainyard_spec import Source, find_workflows_files

    return [Source(p.relative_to(root).as_posix(), read_text(p)) for p in find_workflows_files(root)]


def warn_broken(file: WorkflowsFile) -> None:
    """A warning for each workflow of ``file`` that cannot be run, with its errors."""
    for name, errors in file.broken.items():
        warn(f"workflow '{name}' cannot be run:")
        click.echo("\n".join(f"  {e}" for e in errors), err=True)


def warn_ignored(file: WorkflowsFile) -> None:
    """A warning for each key ``file``'s workflows have that their provider
    ignores, as dstack 0.x ignored it."""
    for error in file.ignored:
        warn(str(error))


def print_json(value: Any) -> None:
    """What ``--json`` prints: the API's answer, indented."""
    click.echo(json.dumps(value, indent=2))


def print_list(
    answer: Sequence[T], row: Callable[[T], list[str]], *, as_json: bool, headers: list[str], empty: str | None
) -> bool:
    """How a command lists what the API answered: with ``--json`` the answer
    as it came; when it is empty, the ``empty`` message on stderr (None: the
    headers alone); else a table on stdout, ``row`` of each item. True when
    the table was printed."""
    if as_json:
        print_json(answer)
        return False
    if not answer and empty is not None:
        click.echo(empty, err=True)
        return False
    from ..output import print_table

    print_table(headers, [row(item) for item in answer], tty=sys.stdout.isatty())
    return True


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise CliError(f"cannot read {path}: {e}") from None


def read_hidden(prompt: str, *, exact: bool = False) -> str:
    """A value typed at a hidden prompt on a terminal, else read from stdin:
    never from the command line, where it would stay in the shell's history.
    Surrounding white space is dropped, or with ``exact`` only one trailing
    newline; "" when nothing was given."""
    if sys.stdin.isatty():
        value: str = click.prompt(prompt, hide_input=True, default="", show_default=False)
        return value
    text = sys.stdin.read()
    return text.removesuffix("\n").removesuffix("\r") if exact else text.strip()


def confirm(question: str) -> bool:
    return click.confirm(question, default=False, err=True)


def display_path(path: Path) -> str:
    """``path`` relative to the current directory when it is below it."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)


def check_member(slug: str, me: Me) -> None:
    """Refuse a workspace the caller does not belong to, naming theirs."""
    slugs = [w["slug"] for w in me["workspaces"]]
    if slug not in slugs:
        raise CliError(f"you are not a member of workspace {slug!r}: yours are {', '.join(slugs) or 'none'}")


def warn(message: str) -> None:
    click.echo(f"warning: {message}", err=True)


def warn_lines(message: str, details: list[str]) -> None:
    click.echo("\n".join([f"warning: {message}:", *details]), err=True)


def _detach(run_name: str) -> NoReturn:
    click.echo(f"\ndetached; the run continues — trainyard stop {run_name} to stop it", err=True)
    sys.exit(130)


def _format_server_error(err: dict[str, Any]) -> str:
    line = f":{err['line']}" if err.get("line") else ""
    return f"{err.get('file', '?')}{line}: {err.get('key', '?')}: {err.get('message', '')}"
