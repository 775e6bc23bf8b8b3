"""Progress of long work on stderr (embedding, rebuilds, index builds): a live bar on a
terminal, plain lines elsewhere.

A bar redraws itself with carriage returns, which a log file or a pipe keeps as one long line of
frames; and a pseudo-terminal without a size (some IDEs, ``docker exec -t``, agent shells) shows
no bar at all. Anywhere but a sized terminal, ``EmbedProgress`` prints a plain line at every
tenth of the work and at least every ``every_s`` seconds:

    embedding: 400/2,326 chunks (17%), 12.3 chunks/s, about 2 min 37 s left
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any, TextIO

STEPS = 10  # a plain line at every tenth of the total
EVERY_S = 30.0  # and at least this often while chunks come in


def live_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` is a terminal with a width, where a bar can redraw itself."""
    try:
        return stream.isatty() and os.get_terminal_size(stream.fileno()).columns > 0
    except (AttributeError, OSError, ValueError):
        return False


def duration(seconds: float) -> str:
    """``45 s``, ``2 min 37 s``, ``1 h 5 min``: a time for people, to the unit that matters."""
    s = max(round(seconds), 0)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60} s" if s % 60 else f"{s // 60} min"
    return f"{s // 3600} h {s % 3600 // 60} min"


class EmbedProgress:
    """Counts work done (chunks by default) against ``total`` and shows it with its rate and
    the time left.

    ``update(n)`` after each batch; ``close()`` (or the ``with`` block) at the end. ``enabled``
    False shows nothing. ``unit`` names one item of the work (``document``, ``block``).
    ``clock`` is for tests.
    """

    def __init__(
        self,
        total: int,
        *,
        desc: str = "embedding",
        unit: str = "chunk",
        stream: TextIO | None = None,
        enabled: bool = True,
        every_s: float = EVERY_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.total = total
        self.done = 0
        self.desc = desc
        self.unit = unit
        self.stream = stream if stream is not None else sys.stderr
        self.every_s = every_s
        self.clock = clock
        self.started = clock()
        self._last_line = self.started
        self._last_step = 0
        self._bar: Any = None
        self._plain = False
        if enabled and total > 0:
            if live_terminal(self.stream):
                from tqdm import tqdm

                self._bar = tqdm(
                    total=total, desc=desc, unit=unit, file=self.stream, dynamic_ncols=True
                )
            else:
                self._plain = True

    def update(self, n: int) -> None:
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
        elif self._plain:
            now = self.clock()
            step = min(self.done, self.total) * STEPS // self.total
            if step > self._last_step or now - self._last_line >= self.every_s:
                self._last_step = max(step, self._last_step)
                self._last_line = now
                print(self.line(now), file=self.stream, flush=True)

    def line(self, now: float | None = None) -> str:
        """``embedding: 400/2,326 chunks (17%), 12.3 chunks/s, about 2 min 37 s left``."""
        elapsed = (self.clock() if now is None else now) - self.started
        rate = self.done / elapsed if elapsed > 0 else 0.0
        percent = min(self.done * 100 // self.total, 100) if self.total else 100
        units = f"{self.unit}s"
        text = (
            f"{self.desc}: {self.done:,}/{self.total:,} {units} ({percent}%), {rate:,.1f} {units}/s"
        )
        left = self.total - self.done
        if left <= 0:
            return f"{text}, done in {duration(elapsed)}"
        if rate > 0:
            return f"{text}, about {duration(left / rate)} left"
        return text

    def advance_to(self, done: int) -> None:
        """``update`` with the count done so far rather than the increment."""
        if done > self.done:
            self.update(done - self.done)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> EmbedProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["EmbedProgress", "duration", "live_terminal"]
