"""The ``trainyard`` console script (and ``python -m trainyard``).

``trainyard ssh`` and ``trainyard ssh-proxy`` (ssh's ProxyCommand, started
for every connection ssh, scp, rsync or VS Code makes) load only their own
command: importing every command takes about half a second, which each
connection would wait for.
"""

from __future__ import annotations

import sys


def main() -> None:
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="replace")  # a job's odd bytes must not crash the CLI
    name = sys.argv[1] if len(sys.argv) > 1 else ""
    if name == "ssh-proxy":
        from .commands.ssh_proxy import ssh_proxy

        ssh_proxy.main(args=sys.argv[2:], prog_name="trainyard ssh-proxy")
    elif name == "ssh":
        from .commands import common
        from .commands.ssh import ssh

        common.Group(name="trainyard", commands=[ssh])(prog_name="trainyard")
    else:
        from .cli import cli

        cli(prog_name="trainyard")
