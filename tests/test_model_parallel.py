"""Model parallelism by neuron blocks: distributed backpropagation on Spark vs one process."""
from __future__ import annotations

import json
import os
import shutil
import tracemalloc

import numpy as np
import pytest

from helpers.models import mp_layers
from sparknet import SGD, Activation, Dense, RMSprop, Sequential
from sparknet.cluster.model_parallel import BlockStateLost, ModelParallel
from sparknet.cluster.model_parallel.block_partition import BlockPlan, split_sizes

HERE = os.path.dirname(os.path.abspath(__file__))


def rel(a, b):
    return float(np.linalg.norm(np.asarray(a, np.float64) - b) / max(np.linalg.norm(b), 1e-300))


def train_both(mp, X, y, steps, batch, lr=2e-3):
    """Train ``mp`` and a single-process copy of its initial weights on the same minibatches."""
    ref = mp.to_sequential()
    init = ref.params.copy()
    opt = RMSprop(lr=lr)
    for s in range(steps):
        xb, yb = X[s * batch:(s + 1) * batch], y[s * batch:(s + 1) * batch]
        mp.train_on_batch(xb, yb)
        ref.train_on_batch(xb.astype(ref.dtype), yb, optimizer=opt)
    return ref, init


# ------------------------------------------------------------------------------- plans
def test_split_sizes_and_plan_errors():
    assert split_sizes(10, 3).tolist() == [0, 4, 7, 10]
    assert split_sizes(5, 5).tolist() == [0, 1, 2, 3, 4, 5]
    with pytest.raises(ValueError, match="cannot cut 4 neurons into 5 blocks"):
        split_sizes(4, 5)
    with pytest.raises(ValueError, match="positive integer block count"):
        BlockPlan({0: 0})
    with pytest.raises(ValueError, match="consecutive"):
        BlockPlan({0: 2, 2: 2}, pair=[(0, 2)])
    with pytest.raises(ValueError, match="only Dense layers"):
        ModelParallel([Dense(8), Activation("tanh"), Dense(3)], {1: 2}, (4,))
    with pytest.raises(ValueError, match="needs whole rows"):
        ModelParallel([Dense(8, activation="softmax"), Dense(3)], {0: 2}, (4,))
    with pytest.raises(ValueError, match="layer 1: cannot cut 3 neurons into 4 blocks"):
        ModelParallel([Dense(8), Dense(3)], {1: 4}, (4,))
    with pytest.raises(ValueError, match="same block count"):
        ModelParallel([Dense(8), Dense(6)], BlockPlan({0: 2, 1: 3}, pair=[(0, 1)]), (4,))
    with pytest.raises(ValueError, match="out of range"):
        ModelParallel([Dense(8), Dense(6)], {5: 2}, (4,))
    with pytest.raises(ValueError, match="unbuilt Sequential"):
        ModelParallel(Sequential([Dense(8), Dense(3)], input_shape=(4,)), {0: 2}, (4,))
    mp = ModelParallel([Dense(8), Dense(6), Dense(4), Dense(3)], BlockPlan({0: 2, 1: 2, 2: 2}, pair=True), (5,))
    assert [st.kind for st in mp.stages] == ["pair", "block", "driver"]
    assert mp.exchanges_per_step == 4
    with pytest.raises(ValueError, match="5 features per sample, the model expects 4|expects 5"):
        mp.train_on_batch(np.zeros((2, 4)), np.zeros((2, 3)))


# --------------------------------------------------------- same maths as one process
def check_same(mp, X, y, tol, steps=3, batch=64):
    ref, init = train_both(mp, X, y, steps=steps, batch=batch)
    got = mp.to_sequential()
    assert rel(ref.params, init) > 1e-4, "training did not move the weights"
    for i, sl in enumerate(ref.param_slices()):
        for name, (a, b, _) in sl.items():
            err = rel(got.params[a:b], ref.params[a:b])
            assert err <= tol, f"layer {i} {name}: relative error {err:.2e} > {tol}"
    return ref


@pytest.mark.slow
@pytest.mark.parametrize("dtype,tol", [("float64", 1e-10), ("float32", 1e-5)])
@pytest.mark.parametrize("pair", [False, True], ids=["blocks", "paired"])
@pytest.mark.parametrize("K", [1, 2, 3, 4])
def test_same_maths_as_single_process(spark, digits_xy, K, pair, dtype, tol):
    """Every layer of a 3-layer MLP cut into K blocks (paired: layers 0 and 1 as a
    Megatron pair, the softmax head alone) trains to the single-process weights."""
    X, y = digits_xy
    mp = ModelParallel(mp_layers(), BlockPlan({0: K, 1: K, 2: K}, pair=pair), (64,), spark=spark,
                       dtype=dtype,
                       seed=K, optimizer=RMSprop(lr=2e-3), name=f"same-{K}")
    try:
        assert [st.kind for st in mp.stages] == (["pair", "block"] if pair else ["block"] * 3)
        check_same(mp, X, y, tol)
    finally:
        mp.close()


def test_blocked_layer_between_driver_layers(spark, digits_xy):
    """Composition: a blocked middle layer between layers that run on the driver; the
    model also predicts like the single-process one."""
    X, y = digits_xy
    mp = ModelParallel(mp_layers(), BlockPlan({1: 3}), (64,), spark=spark, dtype="float64", seed=9,
                       optimizer=RMSprop(lr=2e-3), name="mixed")
    try:
        assert [st.kind for st in mp.stages] == ["driver", "block", "driver"]
        ref = check_same(mp, X, y, 1e-10)
        np.testing.assert_allclose(mp.predict_output(X[:100]), ref.predict_output(X[:100]), rtol=0, atol=1e-10)
        assert mp.evaluate(X[:100], y[:100])["accuracy"] == pytest.approx(
            ref.evaluate(X[:100], y[:100])["accuracy"])
    finally:
        mp.close()


def test_fit_with_lookahead_one_exchange_per_step(spark, digits_xy):
    """fit() runs the paired first stage's next forward pass inside the backward job: one
    Spark job per step, and still exactly single-process training (Sequential.fit)."""
    X, y = digits_xy
    mp = ModelParallel(mp_layers(), BlockPlan({0: 2, 1: 2}, pair=True), (64,), spark=spark,
                       dtype="float64",
                       seed=4, optimizer=RMSprop(lr=2e-3), name="lookahead")
    try:
        ref = mp.to_sequential()
        jobs0 = mp.bytes_moved["jobs"]
        hist = mp.fit(X[:320], y[:320], epochs=2, batch_size=64, shuffle=False)
        ref_hist = ref.fit(X[:320], y[:320], epochs=2, batch_size=64, shuffle=False,
                           optimizer=RMSprop(lr=2e-3), verbose=0)
        assert mp.t == 10
        # per epoch: one forward job, then one backward (+ next forward) job per step
        # (the softmax head runs on the driver)
        assert mp.bytes_moved["jobs"] - jobs0 == 2 * (1 + 5)
        np.testing.assert_allclose(hist["loss"], ref_hist["loss"], rtol=1e-12)
        assert rel(mp.to_sequential().params, ref.params) <= 1e-10
    finally:
        mp.close()


@pytest.mark.parametrize("make_opt", [lambda: SGD(lr=0.1, momentum=0.9, nesterov=True),
                                      lambda: RMSprop(lr=1e-3, momentum=0.5, centered=True, weight_decay=1e-3)],
                         ids=["sgd-nesterov", "rmsprop-centered-momentum"])
def test_optimizer_variants_in_process_blocks(digits_xy, make_opt):
    """The executor code run in this process (spark=None): every optimizer state a block
    keeps (momentum, centred average, weight decay) matches single-process training."""
    X, y = digits_xy
    mp = ModelParallel([Dense(40, activation="sigmoid"), Dense(24, activation="relu"),
                        Dense(10, activation="softmax")], BlockPlan({0: 3, 1: 3, 2: 2}, pair=True), (64,),
                       dtype="float64", seed=3, optimizer=make_opt())
    ref = mp.to_sequential()
    mp.fit(X[:300], y[:300], epochs=2, batch_size=64, shuffle=False)
    ref.fit(X[:300], y[:300], epochs=2, batch_size=64, shuffle=False, optimizer=make_opt(), verbose=0)
    assert rel(mp.to_sequential().params, ref.params) <= 1e-10


def test_time_distributed_blocks_with_mse_in_process():
    rng = np.random.default_rng(0)
    X, Y = rng.standard_normal((40, 5, 8)), rng.standard_normal((40, 5, 3))
    mp = ModelParallel([Dense(16, activation="tanh"), Dense(3)], BlockPlan({0: 2, 1: 2}, pair=True), (5, 8),
                       dtype="float64", optimizer=RMSprop(lr=1e-2))
    ref = mp.to_sequential()
    mp.fit(X, Y, epochs=2, batch_size=10, shuffle=False)
    ref.fit(X, Y, epochs=2, batch_size=10, shuffle=False, optimizer=RMSprop(lr=1e-2), verbose=0)
    assert rel(mp.to_sequential().params, ref.params) <= 1e-10
    assert mp.evaluate(X, Y)["loss"] == pytest.approx(ref.evaluate(X, Y)["loss"], rel=1e-12)


# ------------------------------------------------------------------- bytes per step
def test_bytes_per_step_scale_with_batch_and_width_not_weights(spark):
    rng = np.random.default_rng(0)

    def run(n_in, width, batch, pair=False):
        layers = [Dense(width, activation="tanh"), Dense(10, activation="softmax")]
        plan = BlockPlan({0: 2, 1: 2}, pair=True) if pair else BlockPlan({0: 2})
        mp = ModelParallel(layers, plan, (n_in,), spark=spark, seed=0, name="bytes")
        try:
            X = rng.standard_normal((batch, n_in)).astype(np.float32)
            mp.train_on_batch(X, rng.integers(0, 10, batch))
            return dict(mp.last_step_bytes), mp.n_blocked_params
        finally:
            mp.close()

    small, w_small = run(64, 512, 16)
    wide, w_wide = run(1024, 4096, 16)
    assert w_wide > 100 * w_small
    for (n_in, width, batch), got in (((64, 512, 16), small), ((1024, 4096, 16), wide)):
        # forward: broadcast the input, gather the outputs; backward: broadcast the delta
        # (no input delta is needed below the first layer)
        assert got["broadcast"] == 4 * batch * (n_in + width)
        assert got["collected"] == 4 * batch * width
        assert got["moved"] == 2 * got["broadcast"] + got["collected"]
        assert got["jobs"] == 2
    assert wide["moved"] < 4 * w_wide / 10, "bytes per step must be far below the blocked weights' size"
    double, _ = run(64, 512, 32)
    assert double["moved"] == 2 * small["moved"]
    paired, _ = run(64, 512, 16, pair=True)
    assert paired["jobs"] == 2 and paired["broadcast"] == 4 * 16 * (64 + 10)
    assert paired["collected"] == 2 * 4 * 16 * 10           # one partial sum per block


# ------------------------------------------------------- the driver never holds a layer
@pytest.mark.slow
def test_driver_memory_below_one_blocked_layer_and_streamed_save_load(spark, tmp_path):
    n_in, width, batch = 1024, 16384, 32
    layer_bytes = n_in * width * 4                                   # 64 MiB of float32 weights
    rng = np.random.default_rng(1)
    X = rng.standard_normal((3 * batch, n_in)).astype(np.float32)
    y = rng.integers(0, 10, 3 * batch)
    tracemalloc.start()
    try:
        mp = ModelParallel([Dense(width, activation="relu"), Dense(10, activation="softmax")],
                           BlockPlan({0: 2}), (n_in,), spark=spark, seed=5, name="drivermem")
        mp.fit(X[:2 * batch], y[:2 * batch], epochs=1, batch_size=batch, shuffle=False)
        mp.save(str(tmp_path / "saved"))
        mp2 = ModelParallel.load(str(tmp_path / "saved"), spark=spark, name="drivermem2")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    try:
        assert peak < layer_bytes / 4, f"driver peak {peak / 2**20:.1f} MiB vs layer {layer_bytes / 2**20:.0f} MiB"
        # the weights (and RMSprop state) really live on the executors' side
        held = sum(os.path.getsize(os.path.join(info.directory, f)) for info in mp.backend.res.infos
                   for f in os.listdir(info.directory) if f.startswith("0.kernel"))
        assert held >= 2 * layer_bytes
        files = sorted(os.listdir(tmp_path / "saved"))
        assert files == ["driver.npz", "layer000_block000.npz", "layer000_block001.npz", "manifest.json"]
        # loaded model: same outputs, and the same next step (optimizer state came back too)
        np.testing.assert_array_equal(mp.predict_output(X[:8]), mp2.predict_output(X[:8]))
        mp.train_on_batch(X[2 * batch:], y[2 * batch:])
        mp2.train_on_batch(X[2 * batch:], y[2 * batch:])
        np.testing.assert_array_equal(mp.predict_output(X[:8]), mp2.predict_output(X[:8]))
        assert mp2.t == mp.t == 3
    finally:
        mp.close()
        mp2.close()


# ------------------------------------------------------------------ lost residency
@pytest.mark.slow
def test_lost_blocks_restore_newest_checkpoint_or_fail_clearly(spark, digits_xy, tmp_path):
    X, y = digits_xy
    X = X.astype(np.float32)
    batches = [(X[i * 50:(i + 1) * 50], y[i * 50:(i + 1) * 50]) for i in range(5)]
    mp = ModelParallel(mp_layers(), BlockPlan({0: 2, 1: 2}, pair=True), (64,), spark=spark, seed=2,
                       optimizer=RMSprop(lr=2e-3), checkpoint_dir=str(tmp_path / "ckpt"), name="lost")
    bare = ModelParallel(mp_layers(), BlockPlan({1: 2}), (64,), spark=spark, seed=2,
                         name="lost-bare")
    try:
        for xb, yb in batches[:2]:
            mp.train_on_batch(xb, yb)
        ckpt = mp.checkpoint()
        mp.train_on_batch(*batches[2])                 # progress after the checkpoint
        for info in mp.backend.res.infos:              # the executors' block files vanish
            shutil.rmtree(info.directory)
        mp.train_on_batch(*batches[3])                 # restores the checkpoint, redoes this step
        assert mp.restores == 1 and mp.t == 3
        ref = ModelParallel.load(ckpt, spark=spark, name="lost-ref")
        try:
            ref.train_on_batch(*batches[3])
            np.testing.assert_array_equal(mp.predict_output(X[:20]), ref.predict_output(X[:20]))
        finally:
            ref.close()

        bare.train_on_batch(*batches[0])
        for info in bare.backend.res.infos:
            shutil.rmtree(info.directory)
        for _ in range(2):                             # and it keeps refusing
            with pytest.raises(BlockStateLost, match="missing|gone.*no checkpoint to restore from"):
                bare.train_on_batch(*batches[1])
    finally:
        mp.close()
        bare.close()


# ------------------------------------------------- a model larger than one executor
TWO_BLOCKS = (4096, 65536, 960, 3)   # inputs, units, Python workers' MiB, steps


@pytest.fixture(scope="module", autouse=True)
def _two_blocks_job(request):
    """The standalone test's driver program, started as the module's first test starts
    (when the standalone test is selected and Java is there): it runs on the standalone
    cluster while the module's other tests run here (``None`` otherwise)."""
    from helpers.early_job import start_for

    yield from start_for(request, "test_standalone_two_blocks_fit_where_one_does_not",
                         "mp_standalone_job.py", [str(v) for v in TWO_BLOCKS])


@pytest.mark.slow
def test_standalone_two_blocks_fit_where_one_does_not(standalone_cluster, _two_blocks_job):
    """Master + 2 one-core workers on 127.0.0.1; Python workers limited to 960 MiB of address
    space; a 1 GiB dense layer trains in 2 blocks and fails clearly in 1."""
    steps = TWO_BLOCKS[3]
    stdout, stderr = _two_blocks_job.communicate(timeout=240)
    proc = _two_blocks_job
    lines = [ln for ln in stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, f"job failed ({proc.returncode}):\n{stderr[-4000:]}"
    out = json.loads(lines[-1][len("RESULT "):])
    print("standalone:", out)
    assert out["layer_mib"] > out["limit_mib"]
    assert len(set(out["home"])) == 2, "the two blocks must live on two executors"
    assert out["k2_steps"] == steps and all(np.isfinite(out["k2_losses"]))
    assert out["k2_losses"][-1] < out["k2_losses"][0]
    err = out["k1_error"]
    assert err is not None, "one block of the whole layer should not fit the executor's memory"
    assert err.startswith("BlockMemoryError") and "spark.executor.pyspark.memory" in err
    assert "more blocks" in err and "layer(s) 0" in err
