"""``python -m backend.embedded {run | test [-- PYTEST_ARGS] | services}``."""

from __future__ import annotations

import sys

from backend.embedded import supervisor

USAGE = """usage: python -m backend.embedded COMMAND

  run                      embedded Postgres + Valkey (unless DATABASE_URL / REDIS_URL are set),
                           migrate, then web, worker and beat until Ctrl-C   (make run)
  test [-- PYTEST_ARGS]    pytest against embedded servers under $TRAINYARD_DATA_DIR/test
                           (unless DATABASE_URL and REDIS_URL are set)      (make test)
  services                 only the embedded servers; prints DATABASE_URL and REDIS_URL
"""


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0 if argv else 2
    command, rest = argv[0], argv[1:]
    if command == "test":
        return supervisor.test(rest[1:] if rest[:1] == ["--"] else rest)
    if rest:
        sys.stderr.write(f"{command} takes no arguments\n{USAGE}")
        return 2
    if command == "run":
        return supervisor.run()
    if command == "services":
        return supervisor.services_only()
    sys.stderr.write(f"unknown command {command!r}\n{USAGE}")
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
