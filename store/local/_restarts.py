"""A dead server's restarts: when the next is due (``Backoff``), and how its death reads
(``exit_words``). Pure: the clock is the caller's."""

from __future__ import annotations

import signal
from dataclasses import dataclass

FIRST_S = 1.0
"""The wait before a dead server's first restart; it doubles each time it dies again ..."""
LONGEST_S = 30.0
"""... up to this ..."""
STEADY_S = 60.0
"""... and is back to ``FIRST_S`` once a restarted server has stayed up this long."""


@dataclass(slots=True)
class Backoff:
    """One server's restarts: call ``died`` when it is found dead, ``due`` until it is
    time to start it again, then ``started``."""

    wait: float = FIRST_S
    """How long the next death waits before its restart."""
    started_at: float = 0.0
    """When it was last started (the caller's clock)."""
    restart_at: float | None = None
    """When its restart is due; ``None`` while it runs."""

    def died(self, now: float) -> float:
        """It was found dead at ``now``, or did not start again: returns how long until
        its (next) restart."""
        if self.restart_at is None and now - self.started_at >= STEADY_S:
            self.wait = FIRST_S
        delay = self.wait
        self.wait = min(self.wait * 2, LONGEST_S)
        self.restart_at = now + delay
        return delay

    def due(self, now: float) -> bool:
        """Whether it is dead and its restart is due."""
        return self.restart_at is not None and now >= self.restart_at

    def started(self, now: float) -> None:
        """It was started (again) at ``now``."""
        self.started_at, self.restart_at = now, None


def exit_words(code: int) -> str:
    """How a return code reads: ``exited with code 1``, ``killed by SIGKILL (-9)``."""
    if code >= 0:
        return f"exited with code {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        name = f"signal {-code}"
    return f"killed by {name} (return code {code})"
