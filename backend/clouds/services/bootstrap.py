"""The user data that turns a fresh machine into a runner of this server
(``backend/clouds/bootstrap/user-data.sh``, a POSIX ``sh`` script).

It holds the server's URL, the instance's name, its single-use bootstrap
token and the runner's self-protection limits; nothing else. The same
Instance row always gives the same script (the token is derived from the
row's key), so a redelivered launch task asks for the same machine.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

from django.conf import settings

TEMPLATE = Path(__file__).resolve().parents[1] / "bootstrap" / "user-data.sh"
MAX_BYTES = 16 * 1024  # EC2's limit for user data (before base64)
_PLACEHOLDER = re.compile(r"@([A-Z_]+)@")


class UserDataTooLarge(ValueError):
    pass


def user_data(*, server_url: str, instance_name: str, bootstrap_token: str, cloud: str = "") -> str:
    """The boot script for one machine. ``cloud`` ("aws") lets the runner
    read its instance metadata for the hello."""
    values = {
        "SERVER_URL": server_url.rstrip("/"),
        "INSTANCE_NAME": instance_name,
        "BOOTSTRAP_TOKEN": bootstrap_token,
        "CLOUD": cloud,
        "MAX_LIFETIME": _seconds(settings.TRAINYARD["RUNNER_MAX_LIFETIME_SECONDS"]),
        "POWER_OFF_AFTER": _seconds(settings.TRAINYARD["RUNNER_POWER_OFF_AFTER_SECONDS"]),
    }
    script = _PLACEHOLDER.sub(lambda m: shlex.quote(values[m.group(1)]), TEMPLATE.read_text())
    size = len(script.encode())
    if size > MAX_BYTES:
        raise UserDataTooLarge(f"the user data is {size} bytes; EC2 takes at most {MAX_BYTES}")
    return script


def _seconds(value: float) -> str:
    return str(max(int(value), 0))
