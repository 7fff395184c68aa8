"""roles/sglang/files/sglang_probe.py: the health wait's wall-clock deadline (one deadline across all slices and
probes, however long a single probe takes) and the slices that let the caller print progress."""

import sglang_probe as sp


class Clock:
    def __init__(self, t=1000.0):
        self.t = t
        self.sleeps = []

    def __call__(self):
        return self.t

    def sleep(self, s):
        self.sleeps.append(s)
        self.t += s


def prober(clock, rcs, cost=0.0):
    """A probe returning the given rcs in turn (then the last one), each taking `cost` seconds."""
    calls = []

    def probe():
        rc = rcs[min(len(calls), len(rcs) - 1)]
        calls.append(clock())
        clock.t += cost
        return rc, {"detail": "rc %d" % rc}
    return probe, calls


def run_wait(clock, probe, deadline, slice_s=30, poll_s=10):
    """What the role does: slices until rc != 1; returns (rc, number of slices)."""
    n = 0
    while True:
        n += 1
        rc, _res = sp.wait_slice(probe, deadline, slice_s, poll_s, clock=clock, sleep=clock.sleep)
        if rc != 1:
            return rc, n


def test_ready_at_once():
    c = Clock()
    probe, calls = prober(c, [0])
    assert sp.wait_slice(probe, c.t + 100, 30, 10, clock=c, sleep=c.sleep)[0] == 0
    assert len(calls) == 1 and c.sleeps == []


def test_a_slice_returns_not_yet_after_about_slice_seconds():
    c = Clock()
    probe, calls = prober(c, [1])
    rc, _ = sp.wait_slice(probe, c.t + 3600, 30, 10, clock=c, sleep=c.sleep)
    assert rc == 1
    assert c.t == 1030.0 and len(calls) == 4          # probes at 0, 10, 20, 30 s


def test_failed_unit_stops_the_wait():
    c = Clock()
    probe, _ = prober(c, [1, 1, 3])
    assert sp.wait_slice(probe, c.t + 3600, 30, 10, clock=c, sleep=c.sleep)[0] == 3


def test_the_whole_wait_ends_at_the_deadline_not_retries_times_probe_timeout():
    c = Clock()
    start = c.t
    probe, _ = prober(c, [1])
    rc, slices = run_wait(c, probe, start + 300)
    assert rc == 4
    assert c.t - start == 300.0
    assert slices == 10


def test_slow_probes_cannot_stretch_the_deadline():
    # each probe takes 290 s (a /generate that hangs until its timeout): the wait still ends right after the deadline
    c = Clock()
    start = c.t
    probe, calls = prober(c, [1], cost=290)
    rc, _slices = run_wait(c, probe, start + 600)
    assert rc == 4
    assert c.t - start < 600 + 290
    assert len(calls) == 3


def test_ready_after_a_while_is_reported_ok():
    c = Clock()
    probe, _ = prober(c, [1] * 12 + [0])
    rc, slices = run_wait(c, probe, c.t + 3600)
    assert rc == 0 and slices == 4


def test_a_slice_ends_early_at_the_deadline():
    c = Clock()
    probe, _ = prober(c, [1])
    rc, _ = sp.wait_slice(probe, c.t + 15, 30, 10, clock=c, sleep=c.sleep)
    assert rc == 4 and c.t == 1015.0
