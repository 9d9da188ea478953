"""`RayPool.get_all`: a batch's results read with one wait, a failure still named by the first call that failed,
a timeout named by the last handle (the runner's `_collect` reads every batch this way on Ray)."""

import time

import pytest
import ray

from recmas_ray.distributed.ray_pool import RayPool
from recmas_ray.distributed.routing import DeferredCall, Pending


@ray.remote
def _value(x, delay_s=0.0):
    time.sleep(delay_s)
    return x


@ray.remote
def _fails():
    raise ValueError("bad step")


def test_get_all_returns_each_value_in_order_through_pending_handles(ray_cluster):
    pool = RayPool({}, timeout_s=30, context=", batch t")
    call = DeferredCall()
    call.settle([_value.remote("late")])  # a handle of a call submitted once its inputs existed
    assert pool.get_all([_value.remote(1), Pending(call, 0)], whats=["a", "b"]) == [1, "late"]


def test_get_all_names_the_first_call_that_failed(ray_cluster):
    pool = RayPool({}, timeout_s=30, context=", batch t")
    refs = [_value.remote(1), _fails.remote(), _fails.remote()]
    with pytest.raises(RuntimeError, match=r"^role critic, round 1 \(rollout\), batch t: agent raised .*bad step"):
        pool.get_all(refs, whats=["role planner, round 1 (rollout)", "role critic, round 1 (rollout)",
                                  "role solver, round 1 (decode)"])


def test_get_all_times_out_naming_the_last_call(ray_cluster):
    pool = RayPool({}, timeout_s=0.5, context=", batch t")
    never = DeferredCall()  # its inputs never arrive
    with pytest.raises(RuntimeError, match=r"^role solver, round 1 \(decode\), batch t: no answer within 0.5s"):
        pool.get_all([_value.remote(1), Pending(never, 0)], whats=["role planner, round 1 (rollout)",
                                                                  "role solver, round 1 (decode)"])
    with pytest.raises(RuntimeError, match=r"^last, batch t: no answer within 0.5s"):
        pool.get_all([_value.remote(1), _value.remote(2, 20.0)], whats=["first", "last"])
