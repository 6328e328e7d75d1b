"""Hybrid data x model parallelism: D replicas x K neuron blocks equal one process on the
combined batch, with the gradients combined through the driver in bounded pieces."""
from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from helpers.models import mp_layers
from sparknet import SGD, Dense, RMSprop
from sparknet.cluster.model_parallel import ModelParallel
from sparknet.cluster.model_parallel.block_partition import BlockPlan


def rel(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / max(np.linalg.norm(b), 1e-300))


def blocked_weights(mp, replica):
    return {s.index: mp.get_layer_weights(s.index, replica=replica) for s in mp.blocked}


def assert_same_as_one_process(mp, X, y, make_opt, batch=100, n=350, tol=1e-10):
    """fit() on the hybrid and Sequential.fit on the same combined batches (the last one
    smaller, so the replicas' shards differ in size) end at the same weights; the replicas
    stay identical."""
    ref = mp.to_sequential()
    init = ref.params.copy()
    hist = mp.fit(X[:n], y[:n], epochs=2, batch_size=batch, shuffle=False)
    ref_hist = ref.fit(X[:n], y[:n], epochs=2, batch_size=batch, shuffle=False, optimizer=make_opt(), verbose=0)
    got = mp.to_sequential()
    assert rel(ref.params, init) > 1e-3, "training did not move the weights"
    for i, sl in enumerate(ref.param_slices()):
        for name, (a, b, _) in sl.items():
            err = rel(got.params[a:b], ref.params[a:b])
            assert err <= tol, f"layer {i} {name}: relative error {err:.2e} > {tol}"
    np.testing.assert_allclose(hist["loss"], ref_hist["loss"], rtol=1e-10)
    first = blocked_weights(mp, 0)
    for r in range(1, mp.replicas):
        for i, w in blocked_weights(mp, r).items():
            for name, arr in w.items():
                np.testing.assert_array_equal(arr, first[i][name], err_msg=f"replica {r} layer {i} {name}")
    return ref


OPTIMIZERS = {"rmsprop": lambda: RMSprop(lr=2e-3), "sgd-momentum": lambda: SGD(lr=0.05, momentum=0.9)}


@pytest.mark.parametrize("pair,opt", [
    pytest.param(pair, opt, id=f"{'paired' if pair else 'blocks'}-{opt}",
                 marks=[] if (pair, opt) == (True, "rmsprop") else [pytest.mark.slow])
    for pair in (False, True) for opt in sorted(OPTIMIZERS)])
@pytest.mark.slow
def test_two_replicas_of_two_blocks_equal_one_process(spark, digits_xy, pair, opt):
    X, y = digits_xy
    mp = ModelParallel(mp_layers(), BlockPlan({0: 2, 1: 2, 2: 2}, pair=pair), (64,), spark=spark,
                       dtype="float64",
                       seed=11, optimizer=OPTIMIZERS[opt](), replicas=2, name=f"hybrid-{int(pair)}-{opt}")
    try:
        assert mp.n_slots == 4 and mp.layout.replicas == 2
        assert [st.kind for st in mp.stages] == (["pair", "block"] if pair else ["block"] * 3)
        assert_same_as_one_process(mp, X, y, OPTIMIZERS[opt])
        # one piece per stage for this small net: a forward, a backward (+ first gather) and an
        # apply job per stage, less the applies that ride in the next stage's backward job;
        # fit's lookahead ran this step's first forward in the previous step's last apply job
        assert mp.exchanges_per_step == 2 * len(mp.stages) + 1
        assert mp.last_step_bytes["jobs"] == mp.exchanges_per_step - 1
    finally:
        mp.close()


@pytest.mark.parametrize("replicas,K", [(1, 2), (2, 1)], ids=["D1-K2", "D2-K1"])
def test_degenerate_hybrids_equal_one_process(spark, digits_xy, replicas, K):
    X, y = digits_xy
    mp = ModelParallel(mp_layers(), BlockPlan({0: K, 1: K}, pair=True), (64,), spark=spark,
                       dtype="float64", seed=5,
                       optimizer=RMSprop(lr=2e-3), replicas=replicas, name=f"degenerate-{replicas}-{K}")
    try:
        assert mp.n_slots == replicas * K
        assert_same_as_one_process(mp, X, y, lambda: RMSprop(lr=2e-3))
        # a pair, then the head on the driver; with lookahead (fit) the pair's forward rides in
        # the previous step: one replica needs one job per step (today's model parallelism),
        # two replicas the backward job and one apply job (one piece)
        assert mp.last_step_bytes["jobs"] == (1 if replicas == 1 else 2)
        assert (mp.last_step_bytes["combined"] == 0) == (replicas == 1)
    finally:
        mp.close()


def test_in_process_hybrid_equals_one_process_even_with_an_empty_shard(digits_xy):
    """spark=None runs the same executor code; a batch of one row leaves replica 1's shard empty."""
    X, y = digits_xy
    make_opt = lambda: SGD(lr=0.05, momentum=0.9, nesterov=True)  # noqa: E731
    mp = ModelParallel(mp_layers(), BlockPlan({0: 2, 1: 2}, pair=True), (64,), dtype="float64",
                       seed=3,
                       optimizer=make_opt(), replicas=2)
    assert_same_as_one_process(mp, X, y, make_opt)
    # a pair and a blocked head, combined in pieces of a few rows
    mp = ModelParallel(mp_layers(), BlockPlan({0: 2, 1: 2, 2: 2}, pair=True), (64,),
                       dtype="float64", seed=3,
                       optimizer=make_opt(), replicas=2, combine_bytes=1024)
    assert [len(mp.pieces(st.layers)) > 3 for st in mp.stages] == [True, True]
    ref, opt = mp.to_sequential(), make_opt()
    for xb, yb in ((X[:7], y[:7]), (X[7:8], y[7:8]), (X[8:20], y[8:20])):
        mp.train_on_batch(xb, yb)
        ref.train_on_batch(xb, yb, optimizer=opt)
    assert rel(mp.to_sequential().params, ref.params) <= 1e-10


@pytest.mark.slow
def test_bytes_and_jobs_per_step_of_the_combine(spark, digits_xy):
    """One pair, D = 2: the driver collects D partials of the blocked weights and broadcasts
    their sum once; a smaller combine budget means more pieces, the same weights."""
    X, y = digits_xy
    kw = dict(dtype="float64", seed=2, optimizer=RMSprop(lr=2e-3), replicas=2)
    layers = lambda: [Dense(40, activation="tanh"), Dense(10, activation="softmax")]  # noqa: E731
    one = ModelParallel(layers(), BlockPlan({0: 2, 1: 2}, pair=True), (64,), spark=spark, name="cost1", **kw)
    blocked_bytes = (40 * 64 + 40 + 10 * 40) * 8           # W1, b1 and W2 (b2 stays on the driver)
    many = ModelParallel(layers(), BlockPlan({0: 2, 1: 2}, pair=True), (64,), spark=spark, name="cost2",
                         combine_bytes=blocked_bytes // 3, **kw)
    try:
        assert len(one.pieces(one.blocked)) == 1 and len(many.pieces(many.blocked)) >= 4
        for s in range(2):
            one.train_on_batch(X[s * 64:(s + 1) * 64], y[s * 64:(s + 1) * 64])
            many.train_on_batch(X[s * 64:(s + 1) * 64], y[s * 64:(s + 1) * 64])
        b = one.last_step_bytes
        assert b["combined"] == (2 + 1) * blocked_bytes
        assert b["jobs"] == 3 == one.exchanges_per_step
        # forward: x; backward: the output delta; apply: the summed gradient
        assert b["broadcast"] == 64 * 64 * 8 + 64 * 10 * 8 + blocked_bytes
        p = len(many.pieces(many.blocked))
        assert many.last_step_bytes["jobs"] == 2 + p == many.exchanges_per_step
        assert many.last_step_bytes["combined"] == b["combined"]
        for i in (0, 1):
            for name, arr in one.get_layer_weights(i).items():
                np.testing.assert_array_equal(many.get_layer_weights(i)[name], arr)
    finally:
        one.close()
        many.close()


@pytest.mark.slow
def test_driver_memory_below_one_blocked_layer_with_a_small_combine_budget(spark):
    n_in, width, batch = 256, 2048, 16
    layer_bytes = n_in * width * 8                                   # 4 MiB of float64 weights
    rng = np.random.default_rng(0)
    X = rng.standard_normal((3 * batch, n_in))
    y = rng.integers(0, 10, 3 * batch)
    make = lambda budget, name: ModelParallel(  # noqa: E731
        [Dense(width, activation="relu"), Dense(10, activation="softmax")], BlockPlan({0: 2}), (n_in,),
        spark=spark, dtype="float64", seed=4, optimizer=RMSprop(lr=1e-3), replicas=2, combine_bytes=budget,
        name=name)
    small = make(layer_bytes // 16, "hybridmem")
    whole = make(8 * layer_bytes, "hybridmem-whole")
    try:
        assert len(small.pieces(small.blocked)) >= 16
        small.train_on_batch(X[:batch], y[:batch])                   # warm up (files, workers)
        tracemalloc.start()
        try:
            small.train_on_batch(X[batch:2 * batch], y[batch:2 * batch])
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        print(f"hybrid driver peak {peak / 2**20:.2f} MiB, one blocked layer {layer_bytes / 2**20:.0f} MiB, "
              f"{len(small.pieces(small.blocked))} pieces, bytes/step {small.last_step_bytes}")
        assert peak < layer_bytes, f"driver peak {peak / 2**20:.2f} MiB vs layer {layer_bytes / 2**20:.0f} MiB"
        for xb, yb in ((X[:batch], y[:batch]), (X[batch:2 * batch], y[batch:2 * batch])):
            whole.train_on_batch(xb, yb)
        np.testing.assert_array_equal(small.get_layer_weights(0)["kernel"], whole.get_layer_weights(0)["kernel"])
    finally:
        small.close()
        whole.close()


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2", None])
def test_bad_replicas_raise_naming_the_value(bad):
    with pytest.raises(ValueError, match=rf"replicas must be a positive integer, got {bad!r}"):
        ModelParallel(mp_layers(), BlockPlan({0: 2}), (64,), replicas=bad)
    with pytest.raises(ValueError, match="combine_bytes must be a positive integer, got 0"):
        ModelParallel(mp_layers(), BlockPlan({0: 2}), (64,), replicas=2, combine_bytes=0)


@pytest.mark.slow
def test_save_load_and_to_sequential_of_a_hybrid(spark, digits_xy, tmp_path):
    X, y = digits_xy
    mp = ModelParallel(mp_layers(), BlockPlan({0: 2, 1: 2}, pair=True), (64,), spark=spark,
                       dtype="float64", seed=8,
                       optimizer=SGD(lr=0.05, momentum=0.9), replicas=2, name="hybrid-save")
    loaded = []
    try:
        for s in range(2):
            mp.train_on_batch(X[s * 50:(s + 1) * 50], y[s * 50:(s + 1) * 50])
        seq = mp.to_sequential()
        mp.save(str(tmp_path / "saved"))
        for replicas in (2, 1):
            other = ModelParallel.load(str(tmp_path / "saved"), spark=spark, replicas=replicas,
                                       name=f"hybrid-load-{replicas}")
            loaded.append(other)
            assert other.replicas == replicas and other.t == 2
            np.testing.assert_array_equal(other.to_sequential().params, seq.params)
        # the optimizer state came back too: the next step is the same in all three
        for m in [mp, *loaded]:
            m.train_on_batch(X[100:150], y[100:150])
        after = mp.to_sequential().params
        for other in loaded:
            assert rel(other.to_sequential().params, after) <= 1e-12
        for i, w in blocked_weights(loaded[0], 1).items():
            np.testing.assert_array_equal(w["kernel"], loaded[0].get_layer_weights(i)["kernel"])
    finally:
        mp.close()
        for other in loaded:
            other.close()
