"""Waiting for a condition with a deadline: the one way tests here wait (never a fixed sleep).

The contract of a condition: it returns a truthy value when what the test waits for holds, and
something falsy or raises NotYet("what it saw") while it does not hold yet. Any other exception
(an AssertionError above all) ends the wait at once with its own traceback: a condition can
never pass on a later poll after one of its assertions failed. A caller that knows a condition
may fail in passing (a server that restarts refuses connections) names those exception types in
`retry_on`, and only those count as "not yet" too.
"""

from __future__ import annotations

import time
from typing import Callable, TypeVar

T = TypeVar("T")

Retry = tuple[type[BaseException], ...]


class NotYet(Exception):
    """Raised by a condition that does not hold yet; its message (what the condition saw) is
    quoted in wait_for's TimeoutError if the deadline passes."""


def _checks(condition: Callable[[], T], timeout: float, interval: float,
            retry_on: Retry) -> tuple[T | None, BaseException | None]:
    """Polls until a truthy value or the deadline: (value or None, the last "not yet" raised)."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while True:
        try:
            value = condition()
        except (NotYet, *retry_on) as e:
            value, last = None, e
        if value:
            return value, last
        if time.monotonic() >= deadline:
            return None, last
        time.sleep(interval)  # the polling period of the condition, not a guess at a duration


def poll(condition: Callable[[], T], timeout: float, interval: float = 0.05, retry_on: Retry = ()) -> T | None:
    """Returns condition()'s first truthy value, or None once `timeout` seconds have passed.

    NotYet and the exception types in `retry_on` mean "not yet"; any other exception propagates.
    Between two checks it pauses `interval` seconds: that is the polling period of the
    condition, not a guess at how long something takes."""
    return _checks(condition, timeout, interval, retry_on)[0]


def wait_for(what: str, condition: Callable[[], T], timeout: float = 30.0, interval: float = 0.05,
             retry_on: Retry = ()) -> T:
    """Like poll(), but raises TimeoutError naming `what` (and the last NotYet or `retry_on`
    exception, if any) when the deadline passes. `timeout` is a generous upper bound, never a
    measurement: a test that holds returns as soon as its condition does."""
    value, last = _checks(condition, timeout, interval, retry_on)
    if value:
        return value
    raise TimeoutError(f"timed out after {timeout:g} s waiting for {what}"
                       + (f" (last: {type(last).__name__}: {last})" if last else "")) from last
