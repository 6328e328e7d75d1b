"""The planner (sparknet.cluster.planning.planner) and the cluster simulation (sparknet.cluster.planning.simulate).

The planner's choice is checked against a grid of real fits on digits in the shared
local[2] session: its pick must be within 10% of the fastest measured epoch (the faster of two
interleaved passes over the grid).  The
simulation is checked for the behaviour a cluster must show: more hosts never slower when
compute dominates, stragglers slow synchronous rounds (and async less), bandwidth limits
gradient mode, and no stragglers gives the cost model's own prediction.
"""
from __future__ import annotations

import os
import statistics

import numpy as np
import pytest

os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

from helpers.models import mlp  # noqa: E402
from sparknet import Dense, RMSprop  # noqa: E402
from sparknet.cluster.planning import cost  # noqa: E402
from sparknet.cluster.planning import planner as pl  # noqa: E402
from sparknet.cluster.planning import simulate as sim  # noqa: E402

#: 1,347 digits rows, batch 128: P=1 has 11 steps an epoch, P=2 has 6; tau=4 makes 3 and 2 rounds
#: an epoch, tau=24 rounds of two epochs (P=1) or of four (P=2, the trainer's longest)
GRID = {"partitions": (1, 2), "taus": (4, 24)}
#: epochs per fit: at least three timed rounds after the first (epochs of ~20 ms: a single
#: slow round would otherwise decide between near-equal configurations)
EPOCHS = {4: 4, 24: 16}


@pytest.fixture(scope="module")
def digits_plan(spark, digits):
    X, y, _, _ = digits
    measured = cost.SparkCosts.measure(spark, repeats=1)  # one repeat: the test's time budget
    return pl.plan(mlp(128, input_shape=(64,)), X, spark, modes=["average"], max_partitions=2,
                   taus=list(GRID["taus"]),
                   batch_size=128, verbose=False, spark_costs=measured)


def _measured_epoch(spark, X, y, partitions: int, tau: int) -> float:
    """Seconds per epoch of synchronous average rounds: the median over the epochs after the
    first round (a round of several epochs shares its time between them)."""
    from sparknet.cluster import DataParallelTrainer

    trainer = DataParallelTrainer(mlp(128, input_shape=(64,)), spark, num_partitions=partitions,
                                  sync="average", local_steps=tau,
                                  optimizer=RMSprop(lr=3e-3))
    _, h = trainer.fit(X, y, epochs=EPOCHS[tau], batch_size=128, verbose=0, reuse_data=False)
    first = max(1, round(1 / h["rounds"][0]))   # the epochs of the first round
    return statistics.median(h["time"][first:])


@pytest.mark.slow
def test_planner_choice_is_within_10_percent_of_the_best_measured(spark, digits, digits_plan):
    X, y, _, _ = digits
    best = digits_plan.best
    assert best.mode == "average" and best.settings["partitions"] in GRID["partitions"]
    # two interleaved passes over the grid, each configuration's faster one kept: the
    # configurations are within a few ms of each other, and a load that comes and goes would
    # otherwise favour whichever ran in a quiet moment
    grid = [(P, tau) for P in GRID["partitions"] for tau in GRID["taus"]]
    passes = [{key: _measured_epoch(spark, X, y, *key) for key in order} for order in (grid, grid[::-1])]
    measured = {key: min(p[key] for p in passes) for key in grid}
    fastest = min(measured.values())
    chosen = measured[(best.settings["partitions"], best.settings["tau"])]
    table = ", ".join(f"P={P} tau={t}: {s:.3f} s" for (P, t), s in sorted(measured.items()))
    print(f"planner grid (load {os.getloadavg()[0]:.1f}): chose {pl.describe(best)}; measured per epoch {table}")
    # within 10% of the fastest, give or take 5 ms: these epochs last ~10 ms and one Spark job's
    # jitter is a few ms (a quiet CI run measured P=1 tau=24 at 15 ms and P=2 tau=24 at 11 ms);
    # a wrong choice of tau (4) costs 5-8x
    assert chosen <= 1.10 * fastest + 0.005, f"the plan chose {pl.describe(best)}; measured {table}"


def test_explain_names_the_best_and_the_runner_up(spark, digits, digits_plan):
    text = digits_plan.explain()
    ru = digits_plan.runner_up
    assert ru is not None and pl.config_key(ru) != pl.config_key(digits_plan.best)
    assert "best:      " + pl.describe(digits_plan.best) in text
    assert "runner-up: " + pl.describe(ru) in text
    assert "why: " in text and "job" in text
    kw = digits_plan.trainer_kwargs()
    assert kw == {"num_partitions": digits_plan.best.settings["partitions"], "mode": "sync", "sync": "average",
                  "local_steps": digits_plan.best.settings["tau"]}
    parts = pl.auto_partitions(mlp(128, input_shape=(64,)), digits[0], spark, batch_size=128,
                               local_steps=24)
    assert parts in (1, 2)


@pytest.mark.parametrize("kwargs, match", [
    ({"modes": ["sideways"]}, "sideways"),
    ({"modes": "average"}, "non-empty list"),
    ({"modes": ["model_parallel"]}, "does not apply"),
    ({"batch_size": 0}, "batch_size"),
    ({"max_partitions": 0}, "max_partitions"),
    ({"taus": [0]}, "taus"),
    ({"samples": -5}, "samples"),
    ({"threads": [64]}, "threads"),
])
def test_bad_arguments_raise_clear_errors(spark, digits, digits_plan, kwargs, match):
    X = digits[0]
    with pytest.raises(ValueError, match=match):
        pl.plan(mlp(128, input_shape=(64,)), X, spark, verbose=False, **kwargs)


def test_bad_data_and_memory_that_fits_nothing(spark, digits_plan):
    with pytest.raises(ValueError, match="numpy array"):
        pl.plan(mlp(128, input_shape=(64,)), [[1.0] * 64], spark, verbose=False)
    with pytest.raises(TypeError, match="Sequential"):
        pl.plan("mlp", np.zeros((4, 64)), spark, verbose=False)
    net, sc = digits_plan.net_costs, digits_plan.spark_costs
    some = pl.plan_from_costs(net, sc, 1347, modes=["average"], taus=[2], memory=3.5 * 4 * net.param_bytes)
    assert some.ruled_out and all("GiB per executor" in r.reason for r in some.ruled_out)
    assert "ruled out:" in some.explain()
    with pytest.raises(ValueError, match="no candidate fits"):
        pl.plan_from_costs(net, sc, 1347, modes=["average"], taus=[2], memory=1.0)


def test_auto_blocks_blocks_the_large_layers(spark, digits_plan):
    plan = pl.auto_blocks([Dense(2048, activation="relu"), Dense(2048, activation="relu"),
                           Dense(10, activation="softmax")], (1024,), spark)
    assert set(plan.blocks) == {0, 1} and plan.max_blocks in (1, 2)


# ------------------------------------------------------------------ the simulation
def _net(sample_s: float, param_bytes: int) -> cost.NetworkCosts:
    return cost.NetworkCosts(sample_s=sample_s, eval_sample_s=sample_s / 3, param_bytes=param_bytes,
                             activation_bytes=[512, 40], flops_per_sample=0.0, gemm_gflops=90.0, batch_size=128,
                             update_s=1e-4, n_params=param_bytes // 4)


def _cluster(hosts: int, cores: int = 8, gbit: float = 1.0) -> cost.SparkCosts:
    return cost.SparkCosts.assumed(hosts, cores, bandwidth_gbit=gbit)


def test_more_hosts_are_never_slower_when_compute_bound():
    net = _net(2e-3, 20_000)       # 2 ms per sample, 20 kB of parameters: compute-bound
    samples = 1_000_000
    times = []
    for hosts in (1, 2, 4, 8, 16):
        P = hosts * 8
        steps = -(-samples // P // 128)
        times.append(sim.simulate("average", net, _cluster(hosts), samples, partitions=P, tau=steps).epoch_s)
    assert all(b <= a for a, b in zip(times, times[1:])), times
    assert times[0] / times[-1] > 10


def test_stragglers_slow_synchronous_rounds_and_async_less():
    net = _net(5e-4, 400_000)
    sc, samples, P = _cluster(4), 500_000, 32
    lag = sim.Stragglers(sigma=0.2, fraction=0.05, slowdown=3.0)
    sync = [sim.simulate("average", net, sc, samples, partitions=P, tau=16, stragglers=s).epoch_s
            for s in (sim.NO_STRAGGLERS, lag)]
    asyn = [sim.simulate("async", net, sc, samples, partitions=P, tau=16, stragglers=s).epoch_s
            for s in (sim.NO_STRAGGLERS, lag)]
    assert sync[1] > 1.5 * sync[0], sync
    assert asyn[1] / asyn[0] < sync[1] / sync[0], (sync, asyn)
    grad = sim.simulate("gradient", net, sc, samples, partitions=P, stragglers=lag)
    assert grad.breakdown["stragglers"] > 0


def test_bandwidth_limits_gradient_mode():
    net = _net(1e-4, 8 << 20)       # 8 MiB of parameters per round
    samples, P = 100_000, 16
    slow, fast = (sim.simulate("gradient", net, _cluster(4, 4, gbit), samples, partitions=P) for gbit in (1.0, 10.0))
    assert slow.breakdown["network"] > 5 * fast.breakdown["network"] > 0
    assert slow.epoch_s > fast.epoch_s and slow.speedup < fast.speedup
    avg = sim.simulate("average", net, _cluster(4, 4, 1.0), samples, partitions=P, tau=50)
    assert avg.breakdown["network"] < slow.breakdown["network"] / 20   # tau amortises the bytes


def test_simulation_without_stragglers_is_the_cost_model_and_checks_the_cluster():
    net, sc = _net(3e-4, 1 << 20), _cluster(2, 4)
    a = sim.simulate("average", net, sc, 50_000, partitions=8, tau=8)
    b = cost.predict_sync_average(net, sc, 50_000, 8, 8)
    assert a.epoch_s == pytest.approx(b.epoch_s) and a.settings["hosts"] == 2
    with pytest.raises(ValueError, match="8 tasks of 2 BLAS threads need 16 cores"):
        sim.simulate("average", net, sc, 50_000, partitions=8, tau=8, threads=2)
    with pytest.raises(ValueError, match="mode must be one of"):
        sim.simulate("downpour", net, sc, 50_000, partitions=2)
    with pytest.raises(ValueError, match="sigma"):
        sim.Stragglers(sigma=-1)
    big = pl.plan_from_costs(net, _cluster(5, 18), 1_000_000, modes=["gradient", "average", "async"],
                             taus=[16, 64], threads=[1, 18], predictor=pl.simulated(sim.Stragglers(sigma=0.1)))
    assert big.best.mode in ("average", "async") and big.best.speedup > 10
