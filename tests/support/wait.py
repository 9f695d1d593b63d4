"""One way for a test to wait: on the product's word, bounded, saying what it last saw.

``await wait_until(check, "the claim is prepared")`` polls ``check`` (sync or async) until it
returns something other than None/False/`NotYet` and returns that; after ``timeout`` seconds it
fails with the reason and the last value ``check`` returned (or the exception it raised), so a
CI failure says what the product said, not only that time ran out. A check that has something
to say while the answer is still no returns ``NotYet(what it saw)``. ``until`` is the same for
threads and subprocess-driving tests. Waits are for what the product reports (a readiness
reason, a counter, an object's status); the timeout is a bound for a loaded 2-core machine,
never a stand-in for synchronisation.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

import trio

T = TypeVar("T")

__all__ = ["NotYet", "WaitTimeout", "until", "wait_until"]


class NotYet:
    """A check's "not yet", with what it saw (shown if the wait gives up)."""

    def __init__(self, seen: object) -> None:
        self.seen = seen

    def __repr__(self) -> str:
        return f"not yet: {self.seen!r}"


class WaitTimeout(AssertionError):
    """A wait gave up: the message names what was awaited and what was last seen."""


def _done(value: object) -> bool:
    return value is not None and value is not False and not isinstance(value, NotYet)


def _fail(what: str, timeout: float, last: object) -> WaitTimeout:
    return WaitTimeout(f"gave up after {timeout:g} s waiting for {what}; last seen: {last!r}")


@overload
async def wait_until(
    check: Callable[[], Awaitable[T | NotYet | None]],
    what: str,
    *,
    timeout: float = ...,  # noqa: ASYNC109
    interval: float = ...,
) -> T: ...


@overload
async def wait_until(
    check: Callable[[], T | NotYet | None],
    what: str,
    *,
    timeout: float = ...,  # noqa: ASYNC109
    interval: float = ...,
) -> T: ...


async def wait_until(
    check: Callable[[], Any],
    what: str,
    *,
    timeout: float = 30.0,  # noqa: ASYNC109 - a bound named in the failure, not a deadline
    interval: float = 0.05,
) -> Any:
    """Poll `check` in Trio until it returns a value that is not None/False; return it."""
    deadline = trio.current_time() + timeout
    last: object = "(not checked yet)"
    while True:
        try:
            value: Any = check()
            if inspect.isawaitable(value):
                value = await value
            if _done(value):
                return value
            last = value
        except Exception as exc:
            last = exc
        if trio.current_time() >= deadline:
            raise _fail(what, timeout, last)
        await trio.sleep(interval)


def until(
    check: Callable[[], T | NotYet | None],
    what: str,
    *,
    timeout: float = 30.0,
    interval: float = 0.2,  # its checks start processes and send requests: poll gently
) -> T:
    """`wait_until` for synchronous tests (threads, subprocesses)."""
    deadline = time.monotonic() + timeout
    last: object = "(not checked yet)"
    while True:
        try:
            value = check()
            if _done(value):
                return value  # type: ignore[return-value]
            last = value
        except Exception as exc:
            last = exc
        if time.monotonic() >= deadline:
            raise _fail(what, timeout, last)
        time.sleep(interval)
