"""How long the runner keeps trying a transfer (artifact, checkpoint and
cache uploads, input and checkpoint downloads) through network errors and
server errors (5xx, 429): ``RETRY_SECONDS`` after the first failure
(``--retry-seconds``, ``TRAINYARD_RUNNER_RETRY_SECONDS``; default 10
minutes), pausing between tries with capped exponential backoff and full
jitter (many runners coming back after an outage do not retry in step)."""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field

RETRY_SECONDS = 600.0
FIRST_PAUSE = 1.0
MAX_PAUSE = 30.0


def configure(*, seconds: float) -> None:
    """Set the retry budget for every transfer of this runner process (once, at start)."""
    global RETRY_SECONDS
    if seconds < 0:
        raise ValueError(f"the retry budget must be >= 0 seconds, not {seconds}")
    RETRY_SECONDS = seconds


@dataclass
class Backoff:
    """One transfer's retries: ``pause()`` is how long to sleep before the
    next try, or None once the budget (counted from the first failure) is spent."""

    seconds: float | None = None  # None: RETRY_SECONDS when the first failure happens
    tries: int = 0
    _deadline: float | None = field(default=None, repr=False)

    def pause(self) -> float | None:
        now = time.monotonic()
        if self._deadline is None:
            self._deadline = now + (RETRY_SECONDS if self.seconds is None else self.seconds)
        # The exponent is capped too: 2.0 ** 1024 overflows, and MAX_PAUSE is reached long before.
        wait = random.uniform(FIRST_PAUSE / 2, min(FIRST_PAUSE * 2.0 ** min(self.tries, 30), MAX_PAUSE))
        self.tries += 1
        left = self._deadline - now
        if left <= 0:
            return None
        return min(wait, left)

    def reset(self) -> None:
        """Progress was made (bytes arrived): the budget starts again at the next failure."""
        self.tries, self._deadline = 0, None
