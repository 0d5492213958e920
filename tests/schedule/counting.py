"""Counting calls: the tests' measure of work (tests never assert on the wall clock)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def counted(cls: type, name: str) -> Iterator[list[int]]:
    """Count the calls of `cls.name` inside the block: the tests' measure of work, never the wall clock."""
    calls = [0]
    original = getattr(cls, name)

    def wrapper(*args: object, **kwargs: object) -> object:
        calls[0] += 1
        return original(*args, **kwargs)

    setattr(cls, name, wrapper)
    try:
        yield calls
    finally:
        setattr(cls, name, original)
