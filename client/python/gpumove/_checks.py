"""Checks of what callers pass, shared by both clients and the result types: a bad argument
is a ValueError or TypeError in our words (naming the argument and the value) before any
request is built, never a protobuf or grpc message."""
from __future__ import annotations

import math
import numbers
import re
import time
from typing import Optional

# Byte sizes as the daemon's flags take them (daemon/common/bytes.cc): a whole number and
# an optional suffix, any case: B, K/KiB, M/MiB, G/GiB, T/TiB (powers of 1024) or KB, MB,
# GB, TB (powers of 1000).
_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20,
               "g": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40, "kb": 1000,
               "mb": 1000 ** 2, "gb": 1000 ** 3, "tb": 1000 ** 4}
_SIZE = re.compile(r"\s*(\d+)\s*([A-Za-z]*)\s*")
# The most bytes a request field holds (uint64).
_MAX_BYTES = (1 << 64) - 1
# protobuf's Duration holds at most 10000 years.
MAX_SECONDS = 315_576_000_000


def integer(value) -> Optional[int]:
    """`value` as an int when it is an integer (Python's or numpy's; not a bool), else None."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        return None
    return int(value)


def size(value, name: str = "size") -> int:
    """Bytes from an int or a string such as "4096", "64MiB", "1GiB" or "2GB". Zero passes
    (the daemon says what it makes of it)."""
    words = f"{name} must be a positive number of bytes or a string like '64MiB', not {value!r}"
    n = integer(value)
    if n is None:
        if not isinstance(value, str):
            raise TypeError(words)
        m = _SIZE.fullmatch(value)
        if m is None or m.group(2).lower() not in _SIZE_UNITS:
            raise ValueError(words)
        n = int(m.group(1)) * _SIZE_UNITS[m.group(2).lower()]
    if n < 0 or n > _MAX_BYTES:
        raise ValueError(words)
    return n


def count(value, name: str) -> int:
    """A byte offset or length: an integer from 0 to 2^64-1."""
    n = integer(value)
    if n is None:
        raise TypeError(f"{name} must be a whole number of bytes, not {value!r}")
    if n < 0 or n > _MAX_BYTES:
        raise ValueError(f"{name} must be a number of bytes from 0 to 2^64-1, not {value!r}")
    return n


def seconds(value, name: str, positive: bool = False) -> Optional[float]:
    """A time in seconds (int or float; None passes): finite, not negative (with `positive`,
    above 0) and within what protobuf's Duration holds."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number of seconds or None, not {value!r}")
    v = float(value)
    if not math.isfinite(v) or v < 0 or (positive and v == 0) or v > MAX_SECONDS:
        least = "above 0" if positive else "0 or more"
        raise ValueError(f"{name} must be a finite number of seconds, {least}, not {value!r}")
    return v


def closed(addr: str) -> ValueError:
    """The error of a call on a client after close() (a ValueError, as for a closed file)."""
    return ValueError(f"this gpumove client of {addr} is closed (close() was called or its "
                      "with block ended): make a new one")


class StartingWaits:
    """When to try a call again that a starting daemon refused: it says UNAVAILABLE
    "gpumoved is starting (...)" before it has done anything, so the call is safe to repeat.
    Waits grow from 10 ms to 100 ms, for at most `timeout` seconds (None: 30)."""

    def __init__(self, timeout: Optional[float]):
        self._deadline = time.monotonic() + (30.0 if timeout is None else timeout)
        self._tries = 0

    def next(self, error) -> Optional[float]:
        """Seconds to wait before trying again after `error`, or None to give up."""
        code = getattr(error, "code", lambda: None)()
        details = getattr(error, "details", lambda: "")() or ""
        if str(code) != "StatusCode.UNAVAILABLE" or not details.startswith("gpumoved is starting"):
            return None
        self._tries += 1
        pause = min(0.01 * self._tries, 0.1)
        if time.monotonic() + pause >= self._deadline:
            return None
        return pause
