"""Waiting for a state another process reaches, never sleeping to win a race: the one
helper the share-host tests and their namespace scenarios use."""

from __future__ import annotations

import time


def wait_for(predicate, what: str, timeout: float = 60.0, error: type = AssertionError):
    """``predicate()``'s first true value, checked every 10 ms up to ``timeout`` seconds;
    ``error(f"timed out waiting for {what}")`` after that."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise error(f"timed out waiting for {what}")
