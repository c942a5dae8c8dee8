"""``trainyard ssh-key``: the caller's SSH public keys, which ``trainyard
ssh``, ``scp``, ``rsync`` and VS Code log into running jobs with. Only a
public key is ever read or sent."""

from __future__ import annotations

from pathlib import Path

import click

from ..output import age
from ..sshkeys import default_public_key, read_public_key
from . import common, options


@click.group("ssh-key", cls=common.Group)
def ssh_key() -> None:
    """Your SSH public keys, for SSH into running jobs (in every workspace)."""


@ssh_key.command("add")
@click.argument("path", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--name", default="", help="A label (default: the key's comment).")
def ssh_key_add(path: Path | None, name: str) -> None:
    """Register the public key in PATH (default: ~/.ssh/id_ed25519.pub, else
    id_ecdsa.pub, else id_rsa.pub). A private key is refused, unsent."""
    path = path or default_public_key()
    key = common.client().add_ssh_key(read_public_key(path), name=name)
    click.echo(f"Added SSH key {key['name']} ({key['fingerprint']}) from {common.display_path(path)}", err=True)


@ssh_key.command("ls")
@options.json_option("Print the API's key objects.")
def ssh_key_ls(as_json: bool) -> None:
    """List your SSH public keys."""
    common.print_list(
        common.client().list_ssh_keys(),
        lambda k: [k["name"], k["fingerprint"], k["public_key"].split(" ")[0], age(k.get("created_at")),
                   age(k.get("last_used_at"))],
        as_json=as_json,
        headers=["NAME", "FINGERPRINT", "TYPE", "ADDED", "USED"],
        empty="No SSH keys yet: add one with `trainyard ssh-key add` (or just run `trainyard ssh RUN`).",
    )  # fmt: skip


@ssh_key.command("rm")
@click.argument("key")
def ssh_key_rm(key: str) -> None:
    """Remove the key KEY: its name or fingerprint (SHA256:…), from
    `trainyard ssh-key ls`. Your live SSH sessions end."""
    common.client().remove_ssh_key(key)
    click.echo(f"Removed SSH key {key}", err=True)
