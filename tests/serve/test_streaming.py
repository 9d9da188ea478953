"""`TokenRelay`: the steps of a streamed decode are handed to the replica in step order, whatever order the
relay actor ran the agent's fire-and-forget puts in (an async actor does not keep one sender's order)."""

import ray

from recmas_ray.serve.streaming import RelaySink, TokenRelay

WAIT_S = 30


def _take(relay, key, timeout_s=0.2, **kw):
    return ray.get(relay.take.remote(key, timeout_s, **kw), timeout=WAIT_S)


def _put(relay, key, step, ids):
    ray.get(relay.put.remote(key, step, ids), timeout=WAIT_S)  # waited here to force the arrival order


def test_a_step_that_arrives_early_is_held_until_the_steps_before_it_are_in(ray_cluster):
    relay = TokenRelay.remote()
    try:
        _put(relay, "b", 2, [12])
        _put(relay, "b", 1, [11])
        assert _take(relay, "b") == []  # step 0 is still on its way: nothing may be sent past it
        _put(relay, "b", 0, [10])
        assert _take(relay, "b") == [(0, [10]), (1, [11]), (2, [12])]
        _put(relay, "b", 4, [14])
        _put(relay, "b", 3, [13])
        assert _take(relay, "b") == [(3, [13]), (4, [14])]
    finally:
        ray.kill(relay)


def test_flush_hands_out_what_is_held_past_a_gap_in_order_and_later_copies_are_dropped(ray_cluster):
    relay = TokenRelay.remote()
    try:
        for step in (3, 1, 0):
            _put(relay, "b", step, [step])
        assert _take(relay, "b") == [(0, [0]), (1, [1])]
        assert _take(relay, "b", 0.0, flush=True) == [(3, [3])]  # the batch is over: step 2 will not come
        _put(relay, "b", 2, [2])  # it came after all, and step 3 was sent again: both are behind what was sent
        _put(relay, "b", 3, [3])
        assert _take(relay, "b", 0.0, flush=True) == []
        ray.get(relay.close.remote("b"), timeout=WAIT_S)
        _put(relay, "b", 4, [4])  # a closed batch takes no more steps
        assert _take(relay, "b", 0.0, flush=True) == []
    finally:
        ray.kill(relay)


def test_the_sink_numbers_the_steps_of_each_batch_from_zero(ray_cluster):
    relay = TokenRelay.remote()
    try:
        first, second = RelaySink(relay, "x"), RelaySink(relay, "y")
        for ids in ([1, None], [2, 3]):
            first(ids)
        second([7])
        got = []
        while len(got) < 2:
            steps = _take(relay, "x", WAIT_S)
            assert steps, "a step sent by the sink never reached the relay"
            got += steps
        assert got == [(0, [1, None]), (1, [2, 3])] and _take(relay, "y", WAIT_S) == [(0, [7])]
    finally:
        ray.kill(relay)
