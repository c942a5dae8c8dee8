"""Test hooks driven by a file: each line of the file named by a
``TRAINYARD_TEST_*`` setting makes the server fail one thing once (drop an
acceptance, lose a log batch). Off unless the setting is set."""

from __future__ import annotations

import logging
from pathlib import Path

from django.conf import settings

logger = logging.getLogger(__name__)


def file_hook_fires(setting: str, what: str) -> bool:
    """Whether the hook of ``settings.TRAINYARD[setting]`` fires now; each
    firing uses up one line of its file and logs ``what``."""
    path = settings.TRAINYARD[setting]  # type: ignore[literal-required]
    if not path:
        return False
    file = Path(path)
    try:
        lines = file.read_text().splitlines()
    except OSError:
        return False
    if not lines:
        return False
    file.write_text("\n".join(lines[1:]))
    logger.warning("test hook: %s", what)
    return True
