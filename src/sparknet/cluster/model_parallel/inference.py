"""Inference of a model-parallel network: its output and mean loss over batches (the forward
pass through the stages, no update), and whole layers gathered from the executors' blocks."""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from sparknet.cluster.model_parallel import stages
from sparknet.cluster.model_parallel.jobs import GatherJob
from sparknet.cluster.model_parallel.stages import assemble
from sparknet.losses import Loss

if TYPE_CHECKING:
    from sparknet.cluster.model_parallel.model import ModelParallel
    from sparknet.model import Sequential

#: a forward pass without training: a batch in, the network's output (logits) out
Forward = Callable[[np.ndarray], np.ndarray]


def batched_output(forward: Forward, X: np.ndarray, batch_size: int,
                   softmax_head: bool) -> np.ndarray:
    """The network's output for checked inputs ``X``, ``batch_size`` rows at a time
    (probabilities for a softmax head)."""
    from sparknet.activations import softmax

    outs = [np.array(forward(X[i:i + batch_size])) for i in range(0, X.shape[0], batch_size)]
    out = np.concatenate(outs, axis=0)
    return softmax(out) if softmax_head else out


def mean_loss(forward: Forward, lo: Loss, softmax_head: bool, X: np.ndarray, y: np.ndarray,
              batch_size: int) -> dict[str, float]:
    """Mean loss (and accuracy for classifiers) on checked ``(X, y)``."""
    from sparknet.activations import softmax

    tot = np.zeros(3)
    for i in range(0, X.shape[0], batch_size):
        out = forward(X[i:i + batch_size])
        pred = softmax(out) if (softmax_head and not lo.is_classification) else out
        s, w, _ = lo.value_and_grad(pred, y[i:i + batch_size], need_grad=False)
        c = (float((out.argmax(axis=-1) == y[i:i + batch_size]).sum())
             if lo.is_classification else 0.0)
        tot += (s, w, c)
    res = {"loss": tot[0] / max(tot[1], 1e-12)}
    if lo.is_classification:
        res["accuracy"] = tot[2] / max(tot[1], 1e-12)
    return res


def gather_layers(mp: "ModelParallel", indices: Sequence[int],
                  replica: int = 0) -> dict[int, dict[str, np.ndarray]]:
    """The whole ``kernel``/``bias`` of each layer in ``indices`` (blocked ones gathered from
    ``replica``'s blocks in one Spark job)."""
    by_idx = {s.index: s for s in mp.blocked}
    wanted = tuple(by_idx[i] for i in indices if i in by_idx)
    parts_all = (mp.backend.run(GatherJob(mp.layout, wanted, replica=replica)) if wanted
                 else [])
    return {i: assemble(mp, i, by_idx, parts_all, replica) for i in indices}


def to_sequential(mp: "ModelParallel", architecture: dict[str, Any]) -> "Sequential":
    """A single-process Sequential of ``architecture`` with ``mp``'s weights and its driver
    stages' running statistics."""
    from sparknet.model import Sequential

    model = Sequential.from_config(architecture)
    weights = gather_layers(mp, [i for i, sl in enumerate(model.param_slices()) if sl])
    for i, sl in enumerate(model.param_slices()):
        for k, (a, b, _shape) in sl.items():
            model.params[a:b] = weights[i][k].reshape(-1)
    stages.state_into(mp.stages, model)
    return model
