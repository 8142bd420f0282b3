"""Progress reporting for long calls.

Public functions take ``progress: bool | Callable[[int, int], None] = False``:

* ``False``: silent;
* ``True``: a tqdm bar when tqdm is installed (extra ``progress``), else silent;
* a callable: called with ``(done, total)`` about every 100 ms from the calling thread. If it
  raises, the computation stops and the exception propagates.

Ctrl-C stops a long call in every case: the compiled core is watched from the calling
thread, which sees the interrupt and asks the workers to stop.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable
from typing import Any

__all__ = ["ProgressReporter", "reporter"]


class ProgressReporter:
    """A ``(done, total)`` callback with a ``close()``; usable as a context manager."""

    def __init__(self, callback: Callable[[int, int], Any] | None, bar: Any = None) -> None:
        self._callback = callback
        self._bar = bar

    @property
    def callback(self) -> Callable[[int, int], Any] | None:
        """What to hand to the core (``None`` when silent)."""
        if self._bar is not None:
            return self._tqdm_update
        return self._callback

    def _tqdm_update(self, done: int, total: int) -> None:
        bar = self._bar
        if bar.total != total:
            bar.total = total
        bar.update(done - bar.n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __enter__(self) -> ProgressReporter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def reporter(progress: Any, desc: str) -> ProgressReporter:
    """Resolves a ``progress`` argument into a :class:`ProgressReporter`."""
    if progress is None or progress is False:
        return ProgressReporter(None)
    if progress is True:
        if importlib.util.find_spec("tqdm") is None:
            return ProgressReporter(None)
        from tqdm.auto import tqdm

        return ProgressReporter(None, bar=tqdm(total=0, desc=desc, unit="it", leave=False))
    if callable(progress):
        return ProgressReporter(progress)
    raise TypeError(f"progress: expected a bool or a callable (done, total), got {type(progress).__name__}")
