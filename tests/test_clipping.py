"""Gradient clipping (``clipnorm``, ``clipvalue``) on every optimizer: against
torch.nn.utils.clip_grad_norm_ / clip_grad_value_ step for step, in a one-process fit, in
data-parallel gradient and average modes, and over model-parallel blocks, where the norm
spans every block and the driver's layers."""
import numpy as np
import pytest

from helpers.models import mlp, mp_layers
from sparknet import SGD, Adam, AdamW, Dense, RMSprop, Sequential
from sparknet.optim import from_config

OPTIMIZERS = {
    "sgd": (lambda **c: SGD(lr=0.05, momentum=0.9, weight_decay=0.01, **c),
            lambda torch, p: torch.optim.SGD(p, lr=0.05, momentum=0.9, weight_decay=0.01, foreach=False)),
    "rmsprop": (lambda **c: RMSprop(lr=0.01, momentum=0.5, centered=True, weight_decay=0.01, **c),
                lambda torch, p: torch.optim.RMSprop(p, lr=0.01, momentum=0.5, centered=True, weight_decay=0.01,
                                                     foreach=False)),
    "adam": (lambda **c: Adam(lr=0.01, weight_decay=0.01, **c),
             lambda torch, p: torch.optim.Adam(p, lr=0.01, weight_decay=0.01, foreach=False)),
    "adamw": (lambda **c: AdamW(lr=0.01, amsgrad=True, **c),
              lambda torch, p: torch.optim.AdamW(p, lr=0.01, amsgrad=True, foreach=False)),
}
CLIPS = [dict(clipnorm=1.0), dict(clipvalue=0.05), dict(clipnorm=0.5, clipvalue=0.1)]


def _grads(n=50, steps=8, seed=0):
    """Gradients from 1e-3 to 10 in scale: some steps are clipped, some are not."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n), [rng.standard_normal(n) * 10.0 ** rng.integers(-3, 2) for _ in range(steps)]


def _torch_clip(torch, t, clip):
    if clip.get("clipvalue") is not None:
        torch.nn.utils.clip_grad_value_([t], clip["clipvalue"])
    if clip.get("clipnorm") is not None:
        torch.nn.utils.clip_grad_norm_([t], clip["clipnorm"])


@pytest.mark.parametrize("clip", CLIPS, ids=["norm", "value", "both"])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_clipped_steps_equal_torch(name, clip):
    """clip_grad_value_ then clip_grad_norm_ on .grad, then opt.step(): our weights and our
    in-place clipped gradient equal torch's, float64 to 1e-12 and float32 to 1e-6."""
    torch = pytest.importorskip("torch", reason="torch not installed: torch comparison skipped")
    ours, theirs = OPTIMIZERS[name]
    p0, grads = _grads(seed=len(name))
    clipped_steps = 0
    for dtype, tdtype, tol in ((np.float64, torch.float64, 1e-12), (np.float32, torch.float32, 1e-6)):
        t = torch.tensor(p0.astype(dtype), dtype=tdtype, requires_grad=True)
        topt, opt = theirs(torch, [t]), ours(**clip)
        p = p0.astype(dtype)
        for g in grads:
            t.grad = torch.tensor(g.astype(dtype), dtype=tdtype)
            _torch_clip(torch, t, clip)
            topt.step()
            mine = g.astype(dtype)
            opt.step(p, mine)
            clipped_steps += not np.array_equal(mine, g.astype(dtype))
            np.testing.assert_allclose(mine, t.grad.numpy(), rtol=tol, atol=tol)
            np.testing.assert_allclose(p, t.detach().numpy(), rtol=tol, atol=tol)
    assert 0 < clipped_steps < 2 * len(grads)     # the data clip some steps and leave others


def test_clip_arguments_checked_and_kept_in_config():
    for klass in (SGD, RMSprop, Adam, AdamW):
        for arg in ("clipnorm", "clipvalue"):
            for bad in (0.0, -1.0, float("nan"), float("inf"), "1"):
                with pytest.raises(ValueError, match=f"{klass.__name__} {arg} must be a positive finite number"):
                    klass(**{arg: bad})
        opt = klass(clipnorm=2, clipvalue=0.5)
        cfg = opt.get_config()
        assert (cfg["clipnorm"], cfg["clipvalue"]) == (2.0, 0.5)
        again = from_config(opt.name, cfg)
        assert (again.clipnorm, again.clipvalue) == (2.0, 0.5) and again.get_config() == cfg
        assert klass().get_config()["clipnorm"] is None and not klass().clips


def test_step_bound_honours_the_clip():
    """The divergence guard's bound uses the clipped gradient: it holds, and it is far
    below the unclipped bound for a huge gradient."""
    rng = np.random.default_rng(3)
    for klass in (SGD, RMSprop, Adam):
        clipped, plain = klass(lr=0.01, clipnorm=1.0, clipvalue=0.1), klass(lr=0.01)
        p = rng.standard_normal(100)
        carry = 0.0
        for _ in range(10):
            g = rng.standard_normal(100) * 1e6
            bound, carry = clipped.step_bound(float(np.linalg.norm(g)), float(np.linalg.norm(p)), p.size, carry)
            before = p.copy()
            clipped.step(p, g)
            assert np.linalg.norm(p - before) <= bound * (1 + 1e-9)
            assert np.linalg.norm(g) <= 1.0 + 1e-9 and np.abs(g).max() <= 0.1
        if klass is SGD:
            assert bound < plain.step_bound(1e7, float(np.linalg.norm(p)), p.size, 0.0)[0] / 1e5


def _torch_mlp(torch, model, tdtype):
    """torch.nn layers holding ``model``'s (Dense-relu-Dense) weights."""
    lin = [torch.nn.Linear(64, 16, dtype=tdtype), torch.nn.Linear(16, 10, dtype=tdtype)]
    with torch.no_grad():
        for layer, sl in zip(lin, model.param_slices()):
            for name, (a, b, shape) in sl.items():
                getattr(layer, "weight" if name == "kernel" else "bias").copy_(
                    torch.tensor(model.params[a:b].reshape(shape)))
    return lin


@pytest.mark.parametrize("dtype,tol", [("float64", 1e-12), ("float32", 1e-6)])
def test_one_process_fit_step_for_step_equals_torch(digits, dtype, tol):
    """Sequential.fit with RMSprop(clipnorm) against a torch MLP on digits: cross-entropy,
    backward, clip_grad_norm_ over all parameters, step.  Clipping changes the weights."""
    torch = pytest.importorskip("torch", reason="torch not installed: torch comparison skipped")
    X, y, _, _ = digits
    X, y = X[:256].astype(dtype), y[:256]

    model, plain = (mlp(16, seed=2, input_shape=(64,), dtype=dtype) for _ in range(2))
    tdtype = torch.float64 if dtype == "float64" else torch.float32
    lin = _torch_mlp(torch, model, tdtype)
    params = [q for layer in lin for q in layer.parameters()]
    topt = torch.optim.RMSprop(params, lr=0.01, foreach=False)
    model.fit(X, y, epochs=2, batch_size=32, shuffle=False, optimizer=RMSprop(lr=0.01, clipnorm=1.0), verbose=0)
    plain.fit(X, y, epochs=2, batch_size=32, shuffle=False, optimizer=RMSprop(lr=0.01), verbose=0)
    xt, yt = torch.tensor(X), torch.tensor(y)
    norms = []
    for _ in range(2):
        for i in range(0, len(y), 32):
            topt.zero_grad()
            out = lin[1](torch.relu(lin[0](xt[i:i + 32])))
            torch.nn.functional.cross_entropy(out, yt[i:i + 32]).backward()
            norms.append(float(torch.nn.utils.clip_grad_norm_(params, 1.0)))
            topt.step()
    want = np.concatenate([np.concatenate([layer.weight.detach().numpy().ravel(), layer.bias.detach().numpy()])
                           for layer in lin])
    assert max(norms) > 1.0 and min(norms) < 1.0           # clipped at some steps, not at others
    np.testing.assert_allclose(model.params, want, rtol=tol, atol=tol)
    assert np.linalg.norm(plain.params - want) > 100 * tol * np.linalg.norm(want)


def test_data_parallel_gradient_mode_clips_the_mean_gradient(spark, digits):
    """sync='gradient': the driver clips the exact global minibatch gradient, so the float64
    weights equal one process taking the documented global batches with the same clip."""
    from sparknet.cluster.data.sharding import split_indices
    from sparknet.cluster.data_parallel.trainer import DataParallelTrainer

    X, y, _, _ = digits
    rows, P, B, seed = 300, 3, 100, 5
    X64, y64 = X[:rows].astype(np.float64), y[:rows]

    model, ref, plain = (mlp(16, seed=1, input_shape=(64,), dtype="float64") for _ in range(3))
    DataParallelTrainer(model, spark, num_partitions=P, sync="gradient",
                        optimizer=Adam(lr=1e-2, clipnorm=0.3), seed=seed).fit(X64, y64, epochs=1, batch_size=B,
                                                                             verbose=0)
    opt, opt_plain = Adam(lr=1e-2, clipnorm=0.3), Adam(lr=1e-2)
    shards = [(X64[i], y64[i]) for i in split_indices(rows, P, seed)]
    R = -(-rows // B)
    perms = [np.random.default_rng([seed, 0, p]).permutation(len(sy)) for p, (_, sy) in enumerate(shards)]
    for r in range(R):
        sel = [perm[len(sy) * r // R: len(sy) * (r + 1) // R] for (_, sy), perm in zip(shards, perms)]
        xb = np.concatenate([sx[s_] for (sx, _), s_ in zip(shards, sel)])
        yb = np.concatenate([sy[s_] for (_, sy), s_ in zip(shards, sel)])
        for net, o in ((ref, opt), (plain, opt_plain)):
            net.loss_and_grad(xb, yb, net.loss)
            o.step(net.params, net.grads)
    rel = np.linalg.norm(model.params - ref.params) / np.linalg.norm(ref.params)
    assert rel <= 1e-10, f"distributed and single-process clipped Adam differ: {rel:.3e}"
    assert np.linalg.norm(plain.params - ref.params) / np.linalg.norm(ref.params) > 1e-4


def test_data_parallel_average_mode_clips_each_local_step(spark, digits):
    """sync='average': partitions rebuild the optimizer from its config, clip included, and
    clip every local step: the weights differ from an unclipped fit and still learn."""
    from sparknet.cluster.data_parallel.trainer import DataParallelTrainer

    X, y, Xt, yt = digits
    fits = {}
    for clip in (None, 0.05):
        model = Sequential([Dense(64, activation="relu"), Dense(10, activation="softmax")], seed=0)
        DataParallelTrainer(model, spark, num_partitions=2, optimizer=RMSprop(lr=3e-3, clipnorm=clip),
                            local_steps=11, seed=1).fit(X, y, epochs=4, batch_size=32, verbose=0)
        fits[clip] = model
    a, b = fits[None].params, fits[0.05].params
    assert np.linalg.norm(a - b) / np.linalg.norm(a) > 1e-2
    assert fits[0.05].evaluate(Xt, yt)["accuracy"] > 0.9


def _mp_against_one_process(mp, X, y, make_opt):
    """Fit ``mp`` and one process from its initial weights (same batches); relative distance
    of the weights, and how far clipping moved the one-process weights."""
    ref, plain = mp.to_sequential(), mp.to_sequential()
    mp.fit(X, y, epochs=2, batch_size=64, shuffle=False)
    ref.fit(X, y, epochs=2, batch_size=64, shuffle=False, optimizer=make_opt(), verbose=0)
    cfg = make_opt().get_config()
    cfg.update(clipnorm=None, clipvalue=None)
    plain.fit(X, y, epochs=2, batch_size=64, shuffle=False, optimizer=from_config(make_opt().name, cfg), verbose=0)
    got = mp.to_sequential().params
    norm = np.linalg.norm(ref.params)
    return np.linalg.norm(got - ref.params) / norm, np.linalg.norm(plain.params - ref.params) / norm


@pytest.mark.parametrize("K,pair,on_spark", [pytest.param(2, False, True, marks=pytest.mark.slow),
                                             (3, True, False)],
                         ids=["K2-blocks-spark", "K3-paired-in-process"])
def test_model_parallel_global_norm_spans_every_block(request, digits_xy, K, pair, on_spark):
    """Every layer cut into K blocks (paired: a Megatron pair, its second bias on the
    driver), on Spark and with the same executor code in this process; the norm is summed
    over all blocks and the driver's parameters, then one job applies the factor (with the
    lookahead forward in it): weights equal one process's Sequential with the same
    clipnorm to 1e-10 (float64)."""
    from sparknet.cluster.model_parallel import ModelParallel
    from sparknet.cluster.model_parallel.block_partition import BlockPlan

    X, y = digits_xy
    spark = request.getfixturevalue("spark") if on_spark else None

    def make_opt():
        return RMSprop(lr=3e-3, clipnorm=0.4)
    mp = ModelParallel(mp_layers(), BlockPlan({0: K, 1: K, 2: K}, pair=pair), (64,), spark=spark,
                       dtype="float64", seed=K, optimizer=make_opt(), name=f"clip-{K}")
    try:
        jobs0 = mp.bytes_moved["jobs"]
        diff, moved = _mp_against_one_process(mp, X[:192], y[:192], make_opt)
        assert diff <= 1e-10, f"model-parallel clipnorm differs from one process: {diff:.3e}"
        assert moved > 1e-3
        # per epoch of 3 steps: the first stage's forward of the first step, then per step
        # the other stages' forwards, one backward per stage and the clipped apply (with
        # the next batch's forward of the first stage)
        stages = len(mp.stages)
        assert mp.bytes_moved["jobs"] - jobs0 == 2 * (1 + 3 * (stages - 1 + stages + 1))
    finally:
        mp.close()


@pytest.mark.parametrize("case", ["replicas", "driver-between", "value-only"])
def test_model_parallel_clipping_in_process_blocks(digits_xy, case):
    """The executor code in this process: two replicas whose combined gradient comes in
    several pieces (stored, then scaled), a blocked layer between driver layers (Adam), and
    clipvalue alone (elementwise in every row chunk): each equals one process."""
    from sparknet.cluster.model_parallel import ModelParallel
    from sparknet.cluster.model_parallel.block_partition import BlockPlan

    X, y = digits_xy
    plan, replicas, make_opt = {
        "replicas": (BlockPlan({0: 2, 1: 2, 2: 2}, pair=True), 2, lambda: SGD(lr=0.1, momentum=0.9, clipnorm=0.3)),
        "driver-between": (BlockPlan({1: 3}), 1, lambda: Adam(lr=3e-3, clipnorm=0.2, clipvalue=0.02)),
        "value-only": (BlockPlan({0: 2, 1: 2, 2: 2}), 2, lambda: RMSprop(lr=3e-3, clipvalue=0.005)),
    }[case]
    mp = ModelParallel(mp_layers(), plan, (64,), dtype="float64", seed=5, optimizer=make_opt(),
                       replicas=replicas, combine_bytes=4000)
    if replicas > 1:
        assert len(mp.pieces(mp.stages[0].layers)) > 1
    diff, moved = _mp_against_one_process(mp, X[:256], y[:256], make_opt)
    assert diff <= 1e-10, f"{case}: model-parallel clipping differs from one process: {diff:.3e}"
    assert moved > 1e-3


# ------------------------------------------------------------- Spark ML Estimators
@pytest.mark.slow
def test_estimator_clip_params_reach_the_optimizer_and_the_fit(spark, digits):
    from pyspark.ml.linalg import Vectors

    from sparknet.ml import SparkNetClassifier

    X, y, _, _ = digits
    df = spark.createDataFrame([(Vectors.dense(x), int(t)) for x, t in zip(X[:400], y[:400])],
                               ["features", "label"]).repartition(2)

    def fit(**clip):
        net = Sequential([Dense(16, activation="relu"), Dense(10, activation="softmax")], seed=0)
        clf = SparkNetClassifier(network=net, epochs=2, batchSize=32, syncMethod="gradient", numPartitions=2,
                                 optimizer="sgd", learningRate=0.5, seed=0, **clip)
        net = clf.fit(df).network
        return clf, net.params.copy(), net.optimizer   # the optimizer the fit trained with

    clf, clipped, opt = fit(clipNorm=0.05, clipValue=0.01)
    assert (opt.clipnorm, opt.clipvalue) == (0.05, 0.01)
    assert (clf.getClipNorm(), clf.getClipValue()) == (0.05, 0.01)
    off, plain, opt_off = fit()
    assert (opt_off.clipnorm, opt_off.clipvalue) == (None, None)
    assert np.abs(clipped - plain).max() > 1e-3     # the clip changed the steps taken
    with pytest.raises(TypeError, match="clipNorm must be a finite number >= 0, got -1.0"):  # Spark ML's error type
        SparkNetClassifier(clipNorm=-1.0)
