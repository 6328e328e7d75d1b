"""The trainers' planner-chosen settings: DataParallelTrainer(num_partitions="auto") and
ModelParallel(plan="auto") take what sparknet.cluster.planning.planner picks for the session, and
train with it; bad values are refused naming them."""
from __future__ import annotations

import logging
import math

import numpy as np
import pytest

from helpers.models import mlp
from sparknet import Dense, RMSprop
from sparknet.cluster.planning import planner


@pytest.mark.slow
def test_data_parallel_auto_partitions_uses_the_planners_choice(spark, digits, caplog):
    from sparknet.cluster import DataParallelTrainer

    X, y, Xt, yt = digits
    model = mlp(64, input_shape=(64,))
    trainer = DataParallelTrainer(model, spark, num_partitions="auto", optimizer=RMSprop(lr=3e-3), local_steps=10)
    with caplog.at_level(logging.INFO, logger="sparknet.cluster.data_parallel.trainer"):
        _, h = trainer.fit(X, y, epochs=6, batch_size=32, verbose=0)
    chosen = [r.getMessage() for r in caplog.records if "num_partitions='auto' chose" in r.getMessage()]
    assert len(chosen) == 1
    want = int(chosen[0].split("chose ")[1].split()[0])
    assert 1 <= want <= spark.sparkContext.defaultParallelism
    steps = math.ceil(math.ceil(X.shape[0] / want) / 32)  # local steps per epoch of the largest partition
    assert h.history["rounds"][0] == math.ceil(steps / 10)  # rounds of at most 10 local steps
    assert model.evaluate(Xt, yt)["accuracy"] > 0.9
    with pytest.raises(ValueError, match="num_partitions must be a positive integer or 'auto', got 'many'"):
        DataParallelTrainer(mlp(64, input_shape=(64,)), spark, num_partitions="many")


@pytest.mark.slow
def test_model_parallel_auto_plan_blocks_the_large_layers(spark, digits_xy):
    from sparknet.cluster.model_parallel import ModelParallel

    layers = lambda: [Dense(1024, activation="relu"), Dense(1024, activation="relu"),  # noqa: E731
                      Dense(10, activation="softmax")]
    want = planner.auto_blocks(layers(), (64,), spark)
    X, y = digits_xy
    with ModelParallel(layers(), "auto", (64,), spark=spark, seed=0, name="auto-plan") as mp:
        assert mp.plan.blocks == want.blocks and mp.plan.pair == want.pair
        before = mp.to_sequential().params.copy()
        mp.fit(X[:256], y[:256], epochs=1, batch_size=128)
        assert not np.array_equal(mp.to_sequential().params, before)
    with pytest.raises(ValueError, match="plan='auto' needs a Spark session"):
        ModelParallel(layers(), "auto", (64,), spark=None)
