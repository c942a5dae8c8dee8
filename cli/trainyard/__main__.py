"""``python -m trainyard``: the ``trainyard`` command, run by the interpreter
it is installed in (what ``ssh-config``'s ProxyCommand names)."""

from __future__ import annotations

from .console import main

main()
