"""Commands' deadlines on one thread (sessions/runtimes/deadlines.py): each fires once, at its
time, whatever was scheduled before it; a cancelled one never fires; a slow stop delays no other."""

import threading

from sessions.runtimes import deadlines


def test_a_deadline_fires_once_and_a_cancelled_one_never():
    fired, kept = threading.Event(), []
    deadlines.after(0.05, lambda: (kept.append("due"), fired.set()))
    cancelled = deadlines.after(0.02, lambda: kept.append("cancelled"))
    cancelled.cancel()
    assert fired.wait(10)
    last = threading.Event()
    deadlines.after(0.1, last.set)
    assert last.wait(10)
    assert kept == ["due"]


def test_a_nearer_deadline_scheduled_later_wakes_the_keeper():
    far, near = threading.Event(), threading.Event()
    far_deadline = deadlines.after(60, far.set)  # the keeper sleeps towards this one
    deadlines.after(0.05, near.set)
    try:
        assert near.wait(10), "the nearer deadline waited for the farther one"
        assert not far.is_set()
    finally:
        far_deadline.cancel()


def test_a_slow_callback_delays_no_other_deadline():
    release, other = threading.Event(), threading.Event()
    deadlines.after(0.01, lambda: release.wait(30))  # a stop that hangs
    deadlines.after(0.05, other.set)
    try:
        assert other.wait(10), "a hanging callback held up the next deadline"
    finally:
        release.set()


def test_ended_commands_do_not_pile_up_behind_long_deadlines():
    keeper = deadlines._Keeper()
    for _ in range(1000):
        keeper.after(3600, lambda: None).cancel()
    assert len(keeper._heap) <= 130  # compacted whenever the cancelled are most of the heap


def test_a_callback_thread_that_cannot_start_neither_loses_its_deadline_nor_the_next(monkeypatch):
    real = deadlines.threading.Thread
    refused = []

    def thread(*args, name=None, **kwargs):
        if name == "airlock-deadline" and not refused:  # the first stop's thread: a pids limit says no
            refused.append(name)
            raise RuntimeError("can't start new thread")
        return real(*args, name=name, **kwargs)

    keeper = deadlines._Keeper()
    first, second = threading.Event(), threading.Event()
    monkeypatch.setattr(deadlines.threading, "Thread", thread)
    keeper.after(0.01, first.set)
    assert first.wait(10), "the deadline whose thread could not start was lost"
    keeper.after(0.01, second.set)
    assert second.wait(10), "the keeper died with the failed start"
    assert refused


def test_a_deadline_cancelled_while_its_thread_starts_does_not_stop_the_command():
    stopped = []
    deadline = deadlines.Deadline(0, lambda: stopped.append("stopped"), deadlines._Keeper())
    deadline.cancel()
    deadlines._keep(deadline)
    assert stopped == []
