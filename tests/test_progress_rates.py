"""Build rates and ETAs from samples of replicated progress (common/progress.py)."""
from __future__ import annotations

from common.progress import BuildRates


def test_one_sample_tells_no_rate_and_a_built_view_needs_no_time():
    rates = BuildRates()
    assert rates.observe("v", 10.0, 0, 0.0, built=False).eta_s == -1.0
    done = rates.observe("v", 11.0, 100, 1.0, built=True)
    assert (done.rows_per_s, done.eta_s) == (0.0, 0.0)


def test_rate_and_eta_follow_the_samples():
    rates = BuildRates()
    rates.observe("v", 0.0, 0, 0.0, built=False)
    rate = rates.observe("v", 10.0, 1000, 0.25, built=False)
    assert rate.rows_per_s == 100.0 and rate.eta_s == 30.0


def test_no_progress_means_unknown_eta_and_a_restart_resets_the_window():
    rates = BuildRates()
    rates.observe("v", 0.0, 500, 0.5, built=False)
    assert rates.observe("v", 5.0, 500, 0.5, built=False).eta_s == -1.0
    restarted = rates.observe("v", 6.0, 0, 0.0, built=False)
    assert restarted.eta_s == -1.0 and restarted.rows_per_s == 0.0


def test_old_samples_leave_the_window():
    rates = BuildRates()
    rates.observe("v", 0.0, 0, 0.0, built=False)  # a slow start, then a steady rate
    for second in range(1, 100):
        rate = rates.observe("v", float(second), 1000 + second * 10, 0.1 + second * 0.001, built=False)
    assert 9.9 < rate.rows_per_s < 10.1
    rates.forget_except(set())
    assert rates.observe("v", 200.0, 5000, 0.5, built=False).eta_s == -1.0
