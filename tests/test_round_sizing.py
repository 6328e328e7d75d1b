"""How ``local_steps="timed"`` sizes averaged rounds from the rounds it measured
(``FitContext.resize``): Spark's fixed cost per round is the median of the fit's rounds, so
one slow round does not re-size them, and 4 rounds per epoch are kept while Spark's share
stays within 4 times ``max_overhead`` (``ROUND_SHARES``), or within ``DROP_MARGIN`` times that
for a fit already running 4."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from sparknet.cluster.data_parallel import fit_context as fit_mod
from sparknet.cluster.data_parallel.fit_context import FitContext, RoundLog

ROWS, BATCH, T_STEP, T_FIXED = 30_000, 128, 0.0044, 0.1   # an MNIST MLP partition, as measured


def _ctx() -> FitContext:
    trainer = SimpleNamespace(sync="average", mode="sync", local_steps="timed", max_overhead=0.1, precision="fp32",
                              max_epochs_per_round=4, cost=None,
                              model=SimpleNamespace(params=np.zeros(1000, np.float32)))
    spec = SimpleNamespace(config={"layers": []})
    train = SimpleNamespace(rows=[ROWS, ROWS], resident=SimpleNamespace(key="test-round-sizing"))
    ctx = FitContext(trainer=trainer, spec=spec, train=train, val=None, ps=None, epochs=5, batch_size=BATCH)
    ctx._size(math.ceil(ROWS / BATCH), math.ceil(ROWS / BATCH) // 4)   # 4 rounds, as the estimate gave
    return ctx


def _epoch(ctx: FitContext, fixed: list[float]) -> RoundLog:
    """The RoundLog of an epoch of ``ctx.rounds`` rounds with these fixed costs."""
    compute = ctx.steps_per_round * T_STEP
    return RoundLog(wall=sum(f + compute for f in fixed), compute=compute * len(fixed), rounds=len(fixed),
                    fixed=list(fixed))


@pytest.fixture(autouse=True)
def _no_measured_costs():
    saved = dict(fit_mod._MEASURED)
    yield
    fit_mod._MEASURED.clear()
    fit_mod._MEASURED.update(saved)


def test_one_slow_round_does_not_resize_the_rounds():
    ctx = _ctx()
    assert ctx.rounds == 4
    # the fit's first round paid 0.6 s (a first broadcast, a GC pause); the mean, 0.225 s,
    # would put Spark's share of a 4-round epoch's round at 47%, past the 40% allowed
    ctx.resize(_epoch(ctx, [0.6, T_FIXED, T_FIXED, T_FIXED]))
    assert ctx.cost.t_fixed == pytest.approx(T_FIXED)
    assert ctx.cost.t_step == pytest.approx(T_STEP)
    assert ctx.rounds == 4
    ctx.resize(_epoch(ctx, [T_FIXED] * 4))
    assert ctx.rounds == 4 and ctx.fixed_seen == [0.6] + [T_FIXED] * 7
    # slow rounds, seen again and again (the last 16 rounds' median), do re-size
    ctx.resize(_epoch(ctx, [0.6] * 4))
    assert ctx.rounds == 4
    ctx.resize(_epoch(ctx, [0.6] * 4))
    assert ctx.cost.t_fixed == pytest.approx(0.6) and ctx.rounds < 4


def _fixed_for(share: float, compute: float) -> float:
    """The fixed cost per round that is ``share`` of a round of ``compute`` seconds."""
    return share * compute / (1 - share)


def test_four_rounds_per_epoch_only_within_their_share():
    """4 rounds per epoch stay up to DROP_MARGIN x their share (40%); past it, fewer."""
    warm = dict(fit_mod.ROUND_SHARES)[4] * _ctx().trainer.max_overhead
    margin = fit_mod.DROP_MARGIN
    for share, four in ((0.95 * warm, True), (1.05 * warm, True), (0.98 * margin * warm, True),
                        (1.05 * margin * warm, False)):
        ctx = _ctx()
        steps4 = ctx.steps_per_round
        ctx.resize(_epoch(ctx, [_fixed_for(share, steps4 * T_STEP)] * 4))
        assert ctx.cost.overhead(steps4) == pytest.approx(share)
        assert (ctx.rounds == 4) is four, (share, ctx.rounds)
        if not four:
            assert ctx.cost.overhead(ctx.steps_per_round) <= 2 * ctx.trainer.max_overhead


def test_a_fit_at_one_round_per_epoch_returns_to_four_within_their_share():
    """A fit sized to 1 round per epoch (a slow first epoch, or an estimate) goes back to 4
    as soon as the measured share of 4 is within their allowance, not only 0.7 of it."""
    ctx = _ctx()
    steps_epoch = math.ceil(ROWS / BATCH)
    ctx._size(steps_epoch, steps_epoch)
    assert ctx.rounds == 1
    compute4 = (steps_epoch // 4) * T_STEP
    fixed = _fixed_for(0.3, compute4)   # 30% of a 4-round epoch's round: within 40%, past 0.7 x 40%
    ctx.resize(RoundLog(wall=fixed + steps_epoch * T_STEP, compute=steps_epoch * T_STEP, rounds=1,
                        fixed=[fixed]))
    assert ctx.rounds == 4


def test_a_first_epoch_starts_at_four_rounds_unless_the_estimate_is_past_the_margin():
    """``calibrate``'s sizing from the estimate keeps 4 rounds within DROP_MARGIN x 40%."""
    from sparknet.cluster.planning.cost import RoundCostModel

    steps_epoch = math.ceil(ROWS / BATCH)
    compute4 = (steps_epoch // 4) * T_STEP
    for share, rounds in ((0.45, 4), (0.6, 1)):
        ctx = _ctx()
        cost = RoundCostModel(_fixed_for(share, compute4), T_STEP, 4000)
        steps, _ = ctx._tau(cost, steps_epoch, fit_mod.ROUND_SHARES[0][0])
        ctx._size(steps_epoch, steps)
        assert ctx.rounds == rounds, (share, ctx.rounds)
