"""Data-parallel training on real local Spark (the session-scoped ``spark`` fixture)."""
from __future__ import annotations

import math
import time

import numpy as np
import pytest

from sparknet import Dense, RMSprop, Sequential
from sparknet.cluster.data import split_indices
from sparknet.cluster.data_parallel import DataParallelTrainer
from sparknet.datasets import load_digits


@pytest.fixture(scope="module")
def digits():
    return load_digits()


def _mlp(dtype="float32", hidden=32, seed=0, input_shape=None):
    return Sequential([Dense(hidden, activation="relu"), Dense(10, activation="softmax")],
                      input_shape=input_shape, dtype=dtype, seed=seed)


def test_gradient_sync_equals_single_process_float64(spark, digits):
    """sync='gradient' = single-process RMSprop on the same global minibatches (float64)."""
    X, y, _, _ = digits
    X = X[:600].astype(np.float64)
    y = y[:600]
    P, B, epochs, seed = 3, 100, 2, 5
    model = _mlp("float64", seed=1, input_shape=(64,))
    start = model.params.copy()
    trainer = DataParallelTrainer(model, spark, num_partitions=P, sync="gradient",
                                  optimizer=RMSprop(lr=1e-2), seed=seed)
    trained, history = trainer.fit(X, y, epochs=epochs, batch_size=B, verbose=0)
    assert trained is model
    assert history["rounds"] == [math.ceil(600 / B)] * epochs

    # the reference: one process, the documented schedule, no Spark
    ref = _mlp("float64", seed=1, input_shape=(64,))
    np.testing.assert_array_equal(ref.params, start)
    opt = RMSprop(lr=1e-2)
    shards = [(X[i], y[i]) for i in split_indices(600, P, seed)]
    R = math.ceil(600 / B)
    for e in range(epochs):
        perms = [np.random.default_rng([seed, e, p]).permutation(len(sy)) for p, (_, sy) in enumerate(shards)]
        for r in range(R):
            xs, ys = [], []
            for (sx, sy), perm in zip(shards, perms):
                n = len(sy)
                rows = perm[n * r // R: n * (r + 1) // R]
                xs.append(sx[rows])
                ys.append(sy[rows])
            ref.loss_and_grad(np.concatenate(xs), np.concatenate(ys), ref.loss)
            opt.step(ref.params, ref.grads)
    rel = np.linalg.norm(model.params - ref.params) / np.linalg.norm(ref.params)
    moved = np.linalg.norm(ref.params - start) / np.linalg.norm(start)
    assert moved > 0.05, "training did not move the parameters"
    print(f"relative difference {rel:.3e}, moved {moved:.3f}")
    assert rel <= 1e-10, f"distributed and single-process parameters differ: {rel:.3e}"
