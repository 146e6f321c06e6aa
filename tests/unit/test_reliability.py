"""MoFa fault-tolerance model (eqs. 36-44) against the paper's printed numbers."""

import numpy as np
import pytest

from costmodel.reliability import end_to_end_s, failure_rate_per_s, optimal_interval, steady_state_ettr

# MoFa Table 5: GPUs, GPUs per node, r_f, T_save, I_ckpt, u_b, T_step, S, ETTR (%), T_E2E (s)
TABLE5 = [
    (128, 8, 0.005, 4.19, 10, 134.41, 27.83, 953675, 98.49, 26947190.75),
    (256, 8, 0.005, 2.35, 10, 147.72, 27.99, 476838, 99.11, 13465926.21),
    (512, 8, 0.005, 1.59, 10, 174.34, 28.33, 238419, 99.32, 6800277.57),
    (1024, 8, 0.005, 0.95, 10, 227.58, 28.83, 119210, 99.39, 3457670.27),
    (64, 8, 0.005, 9.3, 10, 127.75, 24.46, 15258790, 96.32, 387465533.9),
    (128, 32, 0.005, 7.7, 10, 134.41, 74.5, 254314, 98.96, 19144461.2),
]


@pytest.mark.parametrize("gpus,per_node,r_f,t_save,interval,u_b,t_step,steps,ettr_pct,e2e_s", TABLE5)
def test_table5_ettr_and_e2e(gpus, per_node, r_f, t_save, interval, u_b, t_step, steps, ettr_pct, e2e_s):
    """MoFa Table 5: ETTR within 0.02 percentage points (the table truncates to two decimals),
    T_E2E within 0.01%."""
    rate = failure_rate_per_s(gpus // per_node, r_f)
    ettr = float(steady_state_ettr(t_step, interval, rate, u_b, t_save))
    assert abs(100 * ettr - ettr_pct) <= 0.02
    e2e = float(end_to_end_s(steps, t_step, interval, rate, u_b, t_save))
    assert abs(e2e / e2e_s - 1) <= 1e-4
    # the exact (eq. 39) ETTR and the steady-state one (eq. 40) agree for long runs
    assert abs(steps * t_step / e2e - ettr) < 1e-5


def test_section_5_4_1_optimal_interval():
    """MoFa 5.4.1: u_b 60 s, T_save 2 s, r_f 0.01, 32 nodes, T_step 28 s -> I* = 37, ETTR 99.59%."""
    rate = failure_rate_per_s(32, 0.01)
    best = int(optimal_interval(np.array([28.0]), rate, 60.0, 2.0)[0])
    assert best == 37
    assert round(100 * float(steady_state_ettr(28.0, best, rate, 60.0, 2.0)), 2) == 99.59
    # ETTR first rises then falls with the interval (MoFa Fig. 4), peaking at I*
    curve = steady_state_ettr(28.0, np.arange(1, 200), rate, 60.0, 2.0)
    assert int(np.argmax(curve)) + 1 == best


def test_optimal_interval_rounds_to_the_better_side():
    rate = failure_rate_per_s(100, 0.02)
    steps = np.array([5.0, 13.0, 41.0])
    best = optimal_interval(steps, rate, 120.0, 30.0)
    for t, i in zip(steps, best):
        e = steady_state_ettr(t, np.array([i - 1, i, i + 1]), rate, 120.0, 30.0)
        assert e[1] >= e[0] and e[1] >= e[2]


def test_no_failures_and_hopeless_failure_rates():
    assert int(optimal_interval(np.array([10.0]), 0.0, 60.0, 5.0)[0]) >= 10**6
    rate = failure_rate_per_s(10000, 50.0)  # failures faster than recovery
    assert float(end_to_end_s(1000, 10.0, 10, rate, 600.0, 5.0)) == float("inf")
    assert float(steady_state_ettr(10.0, 10, rate, 600.0, 5.0)) == 0.0


def test_first_init_and_checkpoint_count_enter_e2e():
    base = float(end_to_end_s(1000, 2.0, 7, 0.0, 0.0, 1.0))
    assert base == pytest.approx(2000 + np.ceil(1000 / 7) * 1.0)
    assert float(end_to_end_s(1000, 2.0, 7, 0.0, 0.0, 1.0, first_init_s=300)) == pytest.approx(base + 300)
