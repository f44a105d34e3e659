"""move(progress=True) for both clients: a tqdm bar of one move's bytes done (when tqdm is
installed), else a line on the "gpumove" logger about every second and at the end."""
from __future__ import annotations

import logging
import time

from gpumove._types import Transfer

log = logging.getLogger("gpumove")


class Progress:
    """Shows the states of one move as a Watch stream hands them over (show() each, then
    close()); `last` is the newest."""

    def __init__(self, first: Transfer):
        try:
            from tqdm import tqdm
        except ImportError:
            tqdm = None
        self.last = first
        self._bar = (tqdm(total=first.length, unit="B", unit_scale=True, unit_divisor=1024,
                          desc=f"move {first.id}") if tqdm is not None else None)
        self._shown = 0
        self._logged = time.monotonic()

    def show(self, t: Transfer) -> bool:
        """Draws (or logs) `t`; True once the move has ended."""
        self.last = t
        if self._bar is not None:
            self._bar.update(t.bytes_done - self._shown)
            self._shown = t.bytes_done
        elif time.monotonic() - self._logged >= 1.0 or t.done:
            self._logged = time.monotonic()
            log.info("move %s: %d of %d bytes (%s)", t.id, t.bytes_done, t.length, t.state)
        return t.done

    def close(self) -> None:
        """Ends the bar (if any)."""
        if self._bar is not None:
            self._bar.close()
