"""How ``local_steps="timed"`` sizes averaged rounds from the rounds it measured (the rule
``FitContext.resize`` applies between epochs: ``measured_cost`` and ``resize_rounds`` of
:mod:`sparknet.cluster.planning.rounds`): Spark's fixed cost per round is
the median of the fit's last rounds, so one slow round does not re-size them, and 4 rounds
per epoch are kept while Spark's share stays within 4 times ``max_overhead``
(``ROUND_SHARES``), or within ``DROP_MARGIN`` times that for a fit already running 4."""
from __future__ import annotations

import math

import pytest

from sparknet.cluster.planning.cost import RoundCostModel
from sparknet.cluster.planning.rounds import (
    DROP_MARGIN,
    FIXED_WINDOW,
    ROUND_SHARES,
    RoundSize,
    choose_tau,
    measured_cost,
    resize_rounds,
    size_rounds,
)

ROWS, BATCH, T_STEP, T_FIXED = 30_000, 128, 0.0044, 0.1   # an MNIST MLP partition, as measured
MAX_OVERHEAD = 0.1   # DataParallelTrainer's default
STEPS_EPOCH = math.ceil(ROWS / BATCH)


def _sized(tau: int) -> RoundSize:
    """The rounds a synchronous timed fit makes of ``tau`` local steps per round."""
    return size_rounds(STEPS_EPOCH, tau, sized=True, multi_epoch=True, max_epochs_per_round=4)


def _first() -> RoundSize:
    return _sized(STEPS_EPOCH // 4)   # 4 rounds, as the estimate gave


def _cost(fixed: list[float], size: RoundSize) -> RoundCostModel:
    """The cost measured after an epoch of ``size``'s rounds, each local step taking
    T_STEP, with the fixed costs ``fixed`` (all the fit's rounds so far, oldest first)."""
    steps = size.rounds * size.steps_per_round
    return measured_cost(fixed, steps * T_STEP, steps, 4000)


def _resize(cost: RoundCostModel, size: RoundSize) -> RoundSize:
    return resize_rounds(cost, STEPS_EPOCH, size, MAX_OVERHEAD, multi_epoch=True, max_epochs_per_round=4)


def test_one_slow_round_does_not_resize_the_rounds():
    size = _first()
    assert size.rounds == 4
    # the fit's first round paid 0.6 s (a first broadcast, a GC pause); the mean, 0.225 s,
    # would put Spark's share of a 4-round epoch's round at 47%, past the 40% allowed
    seen = [0.6, T_FIXED, T_FIXED, T_FIXED]
    cost = _cost(seen, size)
    assert cost.t_fixed == pytest.approx(T_FIXED)
    assert cost.t_step == pytest.approx(T_STEP)
    assert cost.param_bytes == 4000
    size = _resize(cost, size)
    assert size.rounds == 4
    seen += [T_FIXED] * 4
    size = _resize(_cost(seen, size), size)
    assert size.rounds == 4
    # slow rounds, seen again and again (the last 16 rounds' median), do re-size
    seen += [0.6] * 4
    size = _resize(_cost(seen, size), size)
    assert size.rounds == 4
    seen += [0.6] * 4
    assert len(seen) == FIXED_WINDOW
    cost = _cost(seen, size)
    assert cost.t_fixed == pytest.approx(0.6) and _resize(cost, size).rounds < 4
    # only the last FIXED_WINDOW rounds count: older fast rounds do not pull the median down
    assert _cost([T_FIXED] * 8 + seen, size).t_fixed == pytest.approx(0.6)


def _fixed_for(share: float, compute: float) -> float:
    """The fixed cost per round that is ``share`` of a round of ``compute`` seconds."""
    return share * compute / (1 - share)


def test_four_rounds_per_epoch_only_within_their_share():
    """4 rounds per epoch stay up to DROP_MARGIN x their share (40%); past it, fewer."""
    warm = dict(ROUND_SHARES)[4] * MAX_OVERHEAD
    for share, four in ((0.95 * warm, True), (1.05 * warm, True), (0.98 * DROP_MARGIN * warm, True),
                        (1.05 * DROP_MARGIN * warm, False)):
        size = _first()
        steps4 = size.steps_per_round
        cost = _cost([_fixed_for(share, steps4 * T_STEP)] * 4, size)
        assert cost.overhead(steps4) == pytest.approx(share)
        after = _resize(cost, size)
        assert (after.rounds == 4) is four, (share, after.rounds)
        if not four:
            assert cost.overhead(after.steps_per_round) <= 2 * MAX_OVERHEAD


def test_a_fit_at_one_round_per_epoch_returns_to_four_within_their_share():
    """A fit sized to 1 round per epoch (a slow first epoch, or an estimate) goes back to 4
    as soon as the measured share of 4 is within their allowance, not only 0.7 of it."""
    size = _sized(STEPS_EPOCH)
    assert size.rounds == 1
    compute4 = (STEPS_EPOCH // 4) * T_STEP
    fixed = _fixed_for(0.3, compute4)   # 30% of a 4-round epoch's round: within 40%, past 0.7 x 40%
    assert _resize(_cost([fixed], size), size).rounds == 4


def test_a_first_epoch_starts_at_four_rounds_unless_the_estimate_is_past_the_margin():
    """``calibrate``'s sizing from the estimate keeps 4 rounds within DROP_MARGIN x 40%."""
    compute4 = (STEPS_EPOCH // 4) * T_STEP
    for share, rounds in ((0.45, 4), (0.6, 1)):
        cost = RoundCostModel(_fixed_for(share, compute4), T_STEP, 4000)
        steps, _ = choose_tau(cost, STEPS_EPOCH, MAX_OVERHEAD, ROUND_SHARES[0][0])
        assert _sized(steps).rounds == rounds, (share, steps)
