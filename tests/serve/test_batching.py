"""The batch queue (asyncio, no Ray): compatible requests share a batch up to max_batch_size, different keys
never do, the wait timeout starts a partial batch, at most max_concurrent_batches run, failures reach
every request of their batch."""

import asyncio

import pytest

from recmas_ray.serve.batching import Batcher


def run(coro):
    return asyncio.run(asyncio.wait_for(coro, 30))


class Recorder:
    def __init__(self, seconds=0.05):
        self.batches, self.running, self.most_running, self.seconds = [], 0, 0, seconds

    async def __call__(self, key, jobs):
        self.batches.append((key, [j.payload for j in jobs]))
        self.running += 1
        self.most_running = max(self.most_running, self.running)
        await asyncio.sleep(self.seconds)
        self.running -= 1
        return [f"{key}:{j.payload}" for j in jobs]


def test_compatible_requests_share_batches_and_keys_never_mix():
    rec = Recorder()

    async def main():
        b = Batcher(rec, max_batch_size=4, batch_wait_timeout_s=0.05, max_concurrent_batches=2)
        jobs = [b.submit("A" if i % 3 else "B", 1, i) for i in range(10)]
        return await asyncio.gather(*jobs)

    out = run(main())
    assert out == [f"{'A' if i % 3 else 'B'}:{i}" for i in range(10)]  # every request gets its own answer
    assert all(len(p) <= 4 for _, p in rec.batches) and len(rec.batches) < 10
    for key, payloads in rec.batches:
        assert all(("A" if i % 3 else "B") == key for i in payloads)
    assert sorted(i for _, p in rec.batches for i in p) == list(range(10))


def test_rows_count_toward_the_batch_size_and_big_requests_run_alone():
    rec = Recorder()

    async def main():
        b = Batcher(rec, max_batch_size=4, batch_wait_timeout_s=0.05, max_concurrent_batches=1)
        return await asyncio.gather(b.submit("k", 3, "three"), b.submit("k", 3, "three'"), b.submit("k", 9, "nine"))

    run(main())
    assert [p for _, p in rec.batches] == [["three"], ["three'"], ["nine"]]


def test_a_lone_request_waits_at_most_the_timeout_and_concurrency_is_capped():
    rec = Recorder(seconds=0.2)

    async def main():
        b = Batcher(rec, max_batch_size=100, batch_wait_timeout_s=0.1, max_concurrent_batches=1)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        first = await b.submit("k", 1, 0)
        waited = loop.time() - t0
        # While one batch runs, arrivals gather: 6 requests -> the first alone, the other five together.
        await asyncio.gather(*[b.submit("k", 1, i) for i in range(1, 2)],
                             *[_later(b, i) for i in range(2, 7)])
        return first, waited, b.queued_rows

    first, waited, queued = run(main())
    assert first == "k:0" and waited >= 0.1 and queued == 0  # it waited for company, then ran alone
    assert rec.most_running == 1 and [p for _, p in rec.batches][1:] == [[1], [2, 3, 4, 5, 6]]


async def _later(b, i):
    await asyncio.sleep(0.12)  # after the batch of [1] started
    return await b.submit("k", 1, i)


def test_a_failed_batch_fails_each_of_its_requests_only():
    async def flaky(key, jobs):
        if key == "bad":
            raise RuntimeError("agent died")
        return [j.payload for j in jobs]

    async def main():
        b = Batcher(flaky, max_batch_size=8, batch_wait_timeout_s=0.01, max_concurrent_batches=2)
        return await asyncio.gather(b.submit("bad", 1, 1), b.submit("bad", 1, 2), b.submit("ok", 1, 3),
                                    return_exceptions=True)

    bad1, bad2, ok = run(main())
    assert isinstance(bad1, RuntimeError) and isinstance(bad2, RuntimeError) and ok == 3


def test_closed_loop_clients_that_arrive_apart_end_up_in_one_batch():
    rec = Recorder(seconds=0.1)

    async def client(b, i):
        await asyncio.sleep(0.06 * i)  # arrivals further apart than the wait timeout
        for k in range(5):
            await b.submit("k", 1, (i, k))
            await asyncio.sleep(0.01)  # the answer's way back and the next request's way in

    async def main():
        b = Batcher(rec, max_batch_size=8, batch_wait_timeout_s=0.05, max_concurrent_batches=1)
        await asyncio.gather(*[client(b, i) for i in range(4)])

    run(main())
    sizes = [len(p) for _, p in rec.batches]
    # after a batch finishes the queue waits for its clients' next requests: no groups taking turns
    first_full = sizes.index(4)
    assert all(n == 4 for n in sizes[first_full:-1]) and len(sizes) - first_full >= 3, sizes


if __name__ == "__main__":
    pytest.main([__file__, "-v", "-x"])
