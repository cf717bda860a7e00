"""The build rate limit (`worker.rate_limit`, pure; `worker.throttle` waits it out)."""
from __future__ import annotations

import threading

from hypothesis import given
from hypothesis import strategies as st

from worker.rate_limit import RateLimit
from worker.throttle import Throttle


def test_a_chunk_waits_until_the_rows_before_it_are_paid_for():
    limit = RateLimit()
    assert limit.delay(10.0, 2000) == 0.0  # the first chunk goes at once
    limit.charge(10.0, 2000, 2000)
    assert abs(limit.delay(10.4, 2000) - 0.6) < 1e-9
    assert limit.delay(11.5, 2000) == 0.0


def test_lifting_the_limit_ends_the_wait_and_forgets_the_debt():
    limit = RateLimit()
    limit.charge(0.0, 10_000, 100)  # 100 s of debt
    assert limit.delay(1.0, 0) == 0.0
    assert limit.delay(1.0, 100) == 0.0  # set again later: the old debt is gone


@given(st.lists(st.integers(1, 5000), min_size=1, max_size=30), st.integers(100, 10_000))
def test_chunks_read_back_to_back_average_at_most_the_rate(chunks, rate):
    limit, now = RateLimit(), 0.0
    for rows in chunks[:-1]:
        now += limit.delay(now, rate)
        limit.charge(now, rows, rate)
    now += limit.delay(now, rate)
    assert now >= sum(chunks[:-1]) / rate - 1e-6  # the last chunk begins once the others are paid for


def test_the_throttle_rereads_the_rate_while_it_waits():
    clock = [0.0]
    rate = [100]
    throttle = Throttle(lambda: rate[0], clock=lambda: clock[0])
    throttle.charge(0.0, 1000)  # 10 s to pay

    class Ticking(threading.Event):
        def wait(self, timeout=None):
            clock[0] += timeout
            if clock[0] >= 1.0:
                rate[0] = 0  # lifted after a second
            return False

    assert 1.0 <= throttle.wait(Ticking()) < 1.5
