"""``trainyard completion bash|zsh|fish``: the shell's completion script
(click's); what completes on Tab is ``completers``'."""

from __future__ import annotations

import click
from click.shell_completion import get_completion_class

SHELLS = ["bash", "zsh", "fish"]


@click.command()
@click.argument("shell", type=click.Choice(SHELLS))
@click.pass_context
def completion(ctx: click.Context, shell: str) -> None:
    """Print the completion script of SHELL (bash, zsh or fish).

    \b
    bash: eval "$(trainyard completion bash)"   (in ~/.bashrc)
    zsh:  eval "$(trainyard completion zsh)"    (in ~/.zshrc, after compinit)
    fish: trainyard completion fish > ~/.config/fish/completions/trainyard.fish

    Commands, options, workflows (from the repo's files) and the
    workspace's runs, tags and environments complete on Tab; a run also
    completes as tag:NAME and WORKFLOW@latest."""
    root = ctx.find_root().command
    script = get_completion_class(shell)
    assert script is not None  # every name in SHELLS is one of click's
    click.echo(script(root, {}, "trainyard", "_TRAINYARD_COMPLETE").source())
