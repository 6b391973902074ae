"""Waiting for a condition with a deadline: the one way tests here wait (never a fixed sleep)."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")


def poll(condition: Callable[[], T], timeout: float, interval: float = 0.05) -> T | None:
    """Returns condition()'s first truthy value, or None once `timeout` seconds have passed.

    Between two checks it pauses `interval` seconds: that is the polling period of the
    condition, not a guess at how long something takes."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            return None
        time.sleep(interval)


def wait_for(what: str, condition: Callable[[], T], timeout: float = 30.0, interval: float = 0.05) -> T:
    """Like poll(), but raises TimeoutError naming `what` (and the last exception the condition
    raised, if any) when the deadline passes."""
    last: list[BaseException] = []

    def attempt():
        try:
            return condition()
        except Exception as e:  # noqa: BLE001 - kept for the error message
            last[:] = [e]
            return None

    value = poll(attempt, timeout, interval)
    if value:
        return value
    raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}"
                       + (f" (last error: {last[0]})" if last else ""))
