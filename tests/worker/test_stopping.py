"""Which pool deaths make a waiting stop count as stuck (the rest is pinned
with real workers in tests/e2e/test_worker_stops.py)."""

from __future__ import annotations

from types import SimpleNamespace

from celery_routines.worker.stopping import PoolProcesses


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def worker_with(*processes: SimpleNamespace) -> SimpleNamespace:
    return SimpleNamespace(pool=SimpleNamespace(_pool=SimpleNamespace(_pool=list(processes))))


def test_a_pool_process_killed_long_before_the_stop_says_nothing_of_it() -> None:
    clock = FakeClock()
    oom = SimpleNamespace(pid=10, exitcode=None)
    pool = PoolProcesses(worker_with(oom), clock=clock)
    pool.look()
    oom.exitcode = -9  # the OOM killer, an hour before the stop
    pool.look()
    clock.now += 3600
    pool.look()
    assert not pool.killed_with_the_stop(stop_began=clock.now)


def test_a_pool_process_killed_with_the_stop_counts_even_once_replaced() -> None:
    clock = FakeClock()
    first = SimpleNamespace(pid=10, exitcode=None)
    worker = worker_with(first)
    pool = PoolProcesses(worker, clock=clock)
    pool.look()
    stop_began = clock.now
    first.exitcode = -15  # the group SIGTERM
    worker.pool._pool._pool[:] = [SimpleNamespace(pid=11, exitcode=None)]  # its replacement
    clock.now += 0.5
    pool.look()
    assert pool.killed_with_the_stop(stop_began)


def test_a_pool_process_that_exited_by_itself_is_no_kill() -> None:
    clock = FakeClock()
    recycled = SimpleNamespace(pid=10, exitcode=None)
    pool = PoolProcesses(worker_with(recycled), clock=clock)
    pool.look()
    recycled.exitcode = 0  # max_tasks_per_child
    pool.look()
    assert not pool.killed_with_the_stop(stop_began=clock.now)
