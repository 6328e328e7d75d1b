"""How ``local_steps="auto"`` sizes averaged rounds from the rounds it measured
(``FitContext.resize``): Spark's fixed cost per round is the median of the fit's rounds, so
one slow round does not re-size them, and 4 rounds per epoch are kept while Spark's share
stays within 4 times ``max_overhead`` (``ROUND_SHARES``)."""
from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pytest

from sparknet.cluster import fit as fit_mod
from sparknet.cluster.fit import FitContext, RoundLog

ROWS, BATCH, T_STEP, T_FIXED = 30_000, 128, 0.0044, 0.1   # an MNIST MLP partition, as measured


def _ctx() -> FitContext:
    trainer = SimpleNamespace(sync="average", mode="sync", local_steps="auto", max_overhead=0.1,
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


def test_four_rounds_per_epoch_only_within_their_share():
    ctx = _ctx()
    warm = dict(fit_mod.ROUND_SHARES)[4] * ctx.trainer.max_overhead
    # a fixed cost whose share of a 4-round epoch's round is just past the limit for 4
    compute = ctx.steps_per_round * T_STEP
    slow = 1.05 * warm * compute / (1 - warm)
    ctx.resize(_epoch(ctx, [slow] * 4))
    assert ctx.cost.overhead(ctx.steps_per_round) <= 2 * ctx.trainer.max_overhead
    assert ctx.rounds < 4
    ctx2 = _ctx()
    ok = 0.95 * warm * compute / (1 - warm)
    ctx2.resize(_epoch(ctx2, [ok] * 4))
    assert ctx2.rounds == 4
