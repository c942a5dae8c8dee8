#!/usr/bin/env python
"""Django's command-line utility for Trainyard.

A configuration error (``backend.core.env.ConfigError``: a setting missing,
malformed or unsafe, raised while the settings load) is printed as its
message alone, without a traceback, and exits with ``EXIT_CONFIG_ERROR``
(78): the message says what to set, a traceback would only bury it.
``make run`` runs its set-up steps through here (backend/embedded/supervisor.py).
"""

from __future__ import annotations

import os
import sys


def main() -> int:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "backend.config.settings")
    from django.core.management import execute_from_command_line

    from backend.core.env import EXIT_CONFIG_ERROR, ConfigError

    try:
        execute_from_command_line(sys.argv)
    except ConfigError as error:
        sys.stderr.write(f"Configuration error: {error}\n")
        return EXIT_CONFIG_ERROR
    return 0


if __name__ == "__main__":
    sys.exit(main())
