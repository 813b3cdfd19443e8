"""One progress bar for the package: ``rich.progress`` when asked for, a silent no-op otherwise.

Training (``rla train``), experiment grids and diagnosis passes all report through this class,
so a disabled bar costs nothing (``rich`` is not even imported) and every caller can call its
methods unconditionally.
"""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["Progress"]


class Progress:
    """A ``rich.progress.Progress`` when ``enabled``, else nothing; tasks are ``None`` when disabled.

    ``label`` (rich markup) switches from rich's default columns to a labelled step counter:
    label, bar, ``done/total``, then time remaining (``eta=True``) or elapsed, then the task's
    ``info`` field when ``info=True``. ``transient`` removes the bar when it stops.
    """

    def __init__(self, enabled: bool, label: str | None = None, *, eta: bool = False, info: bool = False,
                 transient: bool = False):
        self._p = None
        if not enabled:
            return
        from rich import progress as rp

        columns = ()
        if label is not None:
            columns = (rp.TextColumn(label), rp.BarColumn(), rp.MofNCompleteColumn(),
                       rp.TimeRemainingColumn() if eta else rp.TimeElapsedColumn())
            if info:
                columns += (rp.TextColumn("{task.fields[info]}"),)
        self._p = rp.Progress(*columns, transient=transient)
        self._p.start()

    @property
    def enabled(self) -> bool:
        return self._p is not None

    def add(self, description: str, total: float | None, **fields):
        """A new task (``None`` when disabled); ``fields`` feed the columns, e.g. ``completed`` or ``info``."""
        return self._p.add_task(description, total=total, **fields) if self._p else None

    def update(self, task, **kwargs) -> None:
        if self._p:
            self._p.update(task, **kwargs)

    def advance(self, task) -> None:
        if self._p:
            self._p.advance(task)

    def callback(self, description: str) -> Callable[[int, int], None] | None:
        """A ``progress(done, total)`` callable (as :func:`rla.logprobs` takes); its task ends with the pass."""
        if not self._p:
            return None
        task = self._p.add_task(description, total=None)

        def update(done, total):
            self._p.update(task, completed=done, total=total)
            if done >= total:
                self._p.remove_task(task)

        return update

    def close(self) -> None:
        if self._p:
            self._p.stop()
