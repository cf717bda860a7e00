"""The worker's term fence (worker/service.py TermFence): older terms refused, newer ones raise it past the node's."""
from __future__ import annotations

import threading

import pytest

from coordinator.core.errors import FailedPrecondition, Unavailable
from worker.service import TermFence


def test_a_term_older_than_the_nodes_own_is_refused():
    fence = TermFence()
    with pytest.raises(FailedPrecondition, match="stale coordinator term 2: this worker has seen term 3"):
        fence.check(2, current_term=3)
    with pytest.raises(FailedPrecondition):
        fence.admit(2, current_term=3)
    assert fence.highest == 0


def test_a_term_ahead_of_the_nodes_own_is_retried_until_the_node_caught_up_and_then_raises_the_fence():
    fence = TermFence()
    with pytest.raises(Unavailable, match="term 7 is ahead of this node's group0 term 5"):
        fence.check(7, current_term=5)  # a stray client's bogus term cannot raise the fence
    assert fence.highest == 0
    fence.check(7, current_term=7)  # after the read barrier the node knows the caller's term
    fence.admit(7, current_term=7)
    assert fence.highest == 7
    with pytest.raises(FailedPrecondition, match="stale coordinator term 5: this worker has seen term 7"):
        fence.check(5, current_term=7)  # the deposed leader is refused


def test_the_same_term_is_admitted_again_and_the_fence_never_goes_back():
    fence = TermFence()
    fence.admit(4, current_term=4)
    fence.admit(4, current_term=4)
    fence.check(4, current_term=4)
    with pytest.raises(FailedPrecondition):
        fence.check(3, current_term=4)
    assert fence.highest == 4


def test_admit_checks_again_so_a_call_overtaken_by_a_newer_term_is_refused():
    fence = TermFence()
    fence.check(3, current_term=3)  # call of term 3 checked ...
    fence.admit(4, current_term=3)  # ... a call of term 4 is admitted meanwhile ...
    with pytest.raises(FailedPrecondition):
        fence.admit(3, current_term=3)  # ... so term 3 is not admitted after all
    assert fence.highest == 4


def test_a_restarted_worker_still_refuses_terms_older_than_its_nodes_raft_term():
    fence = TermFence()  # a fresh process: nothing admitted yet, the node's Raft term survived the restart
    with pytest.raises(FailedPrecondition):
        fence.check(6, current_term=8)


def test_concurrent_admissions_leave_the_fence_at_the_newest_term():
    fence = TermFence()
    errors = []

    def admit(term: int) -> None:
        try:
            fence.admit(term)
        except FailedPrecondition:
            errors.append(term)

    threads = [threading.Thread(target=admit, args=(t,)) for t in range(1, 41)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert fence.highest == 40 and 40 not in errors
