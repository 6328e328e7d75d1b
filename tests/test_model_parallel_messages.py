"""The model-parallel engine's messages: block job inputs encoded and decoded without copying
their arrays, a missing input named, the replies' bytes counted."""
from __future__ import annotations

import numpy as np
import pytest

from helpers.models import mp_layers
from sparknet import RMSprop
from sparknet.cluster.engine.sizes import nbytes
from sparknet.cluster.model_parallel import LocalBlocks, ModelParallel
from sparknet.cluster.model_parallel.block_partition import BlockPlan
from sparknet.cluster.model_parallel.jobs import ApplyJob, BackwardJob, ChainJob, ForwardJob
from sparknet.cluster.model_parallel.messages import BackwardResult, JobInputs, MissingInput


def test_inputs_encode_and_decode_to_the_same_arrays():
    x, dy = np.ones((3, 4)), np.zeros((3, 2), dtype=np.float32)
    g = (np.arange(6.0).reshape(2, 3), np.arange(2.0))
    inputs = JobInputs(parts=(JobInputs(g=g), JobInputs(dy=dy, x_next=x)))
    wire = inputs.encode()
    assert set(wire) == {"parts"} and [set(p) for p in wire["parts"]] == [{"g"}, {"dy", "x_next"}]
    back = JobInputs.decode(wire)
    assert back.part(0).g is not None and all(a is b for a, b in zip(back.part(0).g, g))
    assert back.part(1).dy is dy and back.part(1).x_next is x and back.part(1).x is None
    assert back.part(2) == JobInputs()                  # past the chain's end: no inputs
    assert JobInputs().encode() == {} and JobInputs.decode(None) == JobInputs()
    assert nbytes(inputs) == nbytes(wire) == x.nbytes + dy.nbytes + g[0].nbytes + g[1].nbytes
    with pytest.raises(ValueError, match="unknown field"):
        JobInputs.decode({"x": x, "y": x})


def test_replies_count_their_arrays():
    dx, ahead = np.ones((2, 5)), np.ones((2, 3), dtype=np.float32)
    r = BackwardResult(dx, ahead, (np.ones(4), None), True, 2.5)
    assert nbytes([r, None, (r,)]) == 2 * (dx.nbytes + ahead.nbytes + 32)


def test_a_job_without_its_input_names_the_job_and_the_input_and_changes_nothing():
    mp = ModelParallel(mp_layers(), BlockPlan({0: 2, 1: 2}, pair=True), (64,), dtype="float64",
                       seed=1, optimizer=RMSprop(lr=1e-3))
    try:
        assert isinstance(mp.backend, LocalBlocks)
        layers = tuple(mp.blocked)
        records = [slot["layers"] for slot in mp.status()]
        with pytest.raises(MissingInput, match=r"ForwardJob needs the input 'x'.*sent: dy"):
            mp.backend.run(ForwardJob(mp.layout, layers), JobInputs(dy=np.ones((2, 10))))
        with pytest.raises(MissingInput, match=r"BackwardJob needs the input 'dy'.*sent: nothing"):
            mp.backend.run(BackwardJob(mp.layout, layers, opt=mp.job_optimizer))
        with pytest.raises(MissingInput, match=r"ApplyJob needs the input 'g'"):
            mp.backend.run(ChainJob(mp.layout, (), jobs=(ApplyJob(mp.layout, layers,
                                                                   opt=mp.job_optimizer),)),
                           JobInputs(parts=(JobInputs(x=np.ones((2, 64))),)))
        assert [slot["layers"] for slot in mp.status()] == records      # no block touched
    finally:
        mp.close()


def test_bytes_moved_is_a_copy_that_sums_the_steps(digits_xy):
    X, y = digits_xy
    mp = ModelParallel(mp_layers(), BlockPlan({0: 2, 1: 2}, pair=True), (64,), dtype="float64",
                       seed=1, optimizer=RMSprop(lr=1e-3), replicas=2)
    try:
        before = mp.bytes_moved
        mp.train_on_batch(X[:32], y[:32])
        step = mp.last_step_bytes
        after = mp.bytes_moved
        assert step["broadcast"] > 0 and step["collected"] > 0 and step["combined"] > 0
        assert {k: after[k] - before[k] for k in after} == step
        after["jobs"] = -1
        assert mp.bytes_moved["jobs"] == before["jobs"] + step["jobs"]
    finally:
        mp.close()


def test_a_spark_dataframe_or_rdd_is_refused_saying_to_collect_it(spark, digits_xy):
    """ModelParallel takes numpy arrays (the driver cuts the minibatches): a DataFrame or an
    RDD in fit, train_on_batch or predict is a TypeError saying how to collect it, and fit
    without y says that y is missing; no block is touched."""
    from pyspark.ml.linalg import Vectors

    X, y = digits_xy
    df = spark.createDataFrame([(Vectors.dense(r), float(t)) for r, t in zip(X[:16], y[:16])],
                               ["features", "label"])
    mp = ModelParallel(mp_layers(), BlockPlan({0: 2}), (64,), dtype="float64", seed=0)
    try:
        before = mp.to_sequential().params.copy()
        want = (r"X is a Spark DataFrame: ModelParallel trains and predicts on numpy arrays, "
                r"which the driver cuts into minibatches for the blocks: collect the features "
                r"and labels to numpy first")
        with pytest.raises(TypeError, match=want):
            mp.fit(df, epochs=1)
        with pytest.raises(TypeError, match=want):
            mp.predict(df)
        with pytest.raises(TypeError, match=r"X is a Spark RDD: ModelParallel trains"):
            mp.train_on_batch(df.rdd, y[:16])
        with pytest.raises(TypeError, match=r"ModelParallel.fit needs y: the labels"):
            mp.fit(X[:16], epochs=1)
        np.testing.assert_array_equal(mp.to_sequential().params, before)
    finally:
        mp.close()


def test_a_blocked_layer_with_silu_says_to_put_the_activation_after_it_which_then_trains_exactly():
    """A block keeps no pre-activation, which silu's (and the gelus') derivative needs: the
    plan names the Activation layer that does, and with it the model trains as one process."""
    from sparknet import Activation, Dense, LeakyReLU

    with pytest.raises(ValueError, match=r"BlockPlan: layer 0 has activation 'silu', whose derivative "
                                         r"needs the pre-activation.*an Activation\('silu'\) layer after it"):
        ModelParallel([Dense(16, activation="silu"), Dense(10, activation="softmax")], BlockPlan({0: 2}),
                      (8,), dtype="float64")
    layers = [Dense(16), Activation("silu"), Dense(12), LeakyReLU(0.1), Dense(10, activation="softmax")]
    mp = ModelParallel(layers, BlockPlan({0: 2, 2: 2}), (8,), dtype="float64", seed=0,
                       optimizer=RMSprop(lr=1e-2))
    ref = mp.to_sequential()
    X = np.random.default_rng(0).standard_normal((48, 8))
    y = np.arange(48) % 10
    mp.fit(X, y, epochs=2, batch_size=16, shuffle=False)
    ref.fit(X, y, epochs=2, batch_size=16, shuffle=False, optimizer=RMSprop(lr=1e-2), verbose=0)
    np.testing.assert_allclose(mp.to_sequential().params, ref.params, rtol=1e-10, atol=1e-12)
