"""``rla.progress.Progress``: the one progress bar (train, experiment, diagnosis)."""

from __future__ import annotations

import io

from rla.progress import Progress


def test_disabled_is_a_silent_no_op():
    bar = Progress(False, "[bold]train[/]", eta=True, info=True)
    assert not bar.enabled
    task = bar.add("train", total=3, completed=0, info="")
    assert task is None
    bar.update(task, completed=1)
    bar.advance(task)
    assert bar.callback("forward") is None
    bar.close()


def test_enabled_counts_steps_and_callback_task_ends_with_its_pass():
    bar = Progress(True, "[bold]train[/]", info=True)
    bar._p.console.file = io.StringIO()  # keep the test's output clean
    task = bar.add("train", total=4, completed=1, info="")
    bar.advance(task)
    bar.update(task, info="reward 0.5")
    t = bar._p.tasks[0]
    assert (t.completed, t.total, t.fields["info"]) == (2, 4, "reward 0.5")
    bar.close()

    bar = Progress(True, transient=True)  # rich's default columns, as diagnosis uses
    bar._p.console.file = io.StringIO()
    cb = bar.callback("forward")
    cb(1, 2)
    assert len(bar._p.tasks) == 1
    cb(2, 2)
    assert len(bar._p.tasks) == 0
    bar.close()
