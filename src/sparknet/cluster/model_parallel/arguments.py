"""The checks of :class:`~sparknet.cluster.model_parallel.model.ModelParallel`'s constructor
arguments, each error naming the argument and the fix, and the per-layer input shapes the
blocks are cut from (the driver layers built, no blocked weight allocated)."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from sparknet import optim as optim_mod
from sparknet.cluster.model_parallel.block_partition import BlockPlan, as_plan
from sparknet.layers.base import Layer
from sparknet.losses import Loss
from sparknet.optim import Optimizer

#: optimizers whose step is elementwise, so that blocks apply it row chunk by row chunk
BLOCK_OPTIMIZERS = ("rmsprop", "sgd", "adam", "adamw")


def unwrap_layers(layers: Any, dtype: Any, seed: int,
                  loss: Any) -> tuple[list[Layer], Any, int, Any]:
    """The layer list (and an unbuilt Sequential's dtype, seed and loss), checked."""
    from sparknet.model import Sequential

    if isinstance(layers, Sequential):
        if layers.built:
            raise ValueError("pass the layers or an unbuilt Sequential: a built model already "
                             "holds every weight on the driver")
        dtype, seed = layers.dtype, layers.seed
        loss = loss if loss is not None else layers._loss
        layers = layers.layers
    layers = list(layers)
    if not layers or not all(isinstance(l, Layer) for l in layers):
        raise ValueError("ModelParallel needs a non-empty list of Layer instances")
    return layers, dtype, seed, loss


def resolve_plan(plan: Any, layers: list[Layer], input_shape: Sequence[int], spark: Any,
                 replicas: int) -> BlockPlan:
    """``plan`` as a :class:`BlockPlan`; ``"auto"``: the planner's K and pairing for
    ``spark``'s cluster (:func:`~sparknet.cluster.planning.planner.auto_blocks`)."""
    if not (isinstance(plan, str) and plan == "auto"):
        return as_plan(plan)
    if spark is None:
        raise ValueError("plan='auto' needs a Spark session (spark=...): it sizes the "
                         "blocks for its cluster")
    from sparknet.cluster.engine.base import engine_for
    if engine_for(spark).sc is None:
        raise NotImplementedError("plan='auto' probes the executors through a SparkContext; "
                                  "under Spark Connect pass a BlockPlan (the blocks per layer)")
    from sparknet.cluster.planning.planner import auto_blocks
    return auto_blocks(layers, input_shape, spark, replicas=int(replicas))


def check_dtype(dtype: Any) -> np.dtype:
    """``float32`` or ``float64``, as a numpy dtype."""
    out = np.dtype(dtype)
    if out not in (np.float32, np.float64):
        raise ValueError(f"dtype must be float32 or float64, got {dtype!r}")
    return out


def check_optimizer(optimizer: Any) -> Optimizer:
    """The optimizer (an instance or its name; ``None``: RMSprop), one the blocks can apply."""
    opt = optim_mod.get(optimizer)
    if opt.name not in BLOCK_OPTIMIZERS:
        raise ValueError("model-parallel training supports RMSprop, SGD, Adam and AdamW, got "
                         f"{opt!r}")
    return opt


def check_input_shape(input_shape: Sequence[int]) -> tuple[int, ...]:
    """The per-sample input shape, as positive ints."""
    shape = tuple(int(d) for d in input_shape)
    if not shape or any(d <= 0 for d in shape):
        raise ValueError(f"input_shape must have positive sizes, got {input_shape!r}")
    return shape


def check_job_timeout(job_timeout: Any) -> float | None:
    """A positive number of seconds, or ``None`` (no limit)."""
    if job_timeout is not None and not (isinstance(job_timeout, (int, float))
                                        and job_timeout > 0):
        raise ValueError("job_timeout must be a positive number of seconds or None, got "
                         f"{job_timeout!r}")
    return job_timeout


def layer_shapes(layers: Sequence[Layer], plan: BlockPlan, input_shape: tuple[int, ...],
                 dtype: np.dtype) -> tuple[list[tuple[int, ...]], tuple[int, ...]]:
    """Per-sample input shape of every layer and the network's output shape, building the
    driver layers only (no blocked weight is allocated here)."""
    shapes, shape = [], input_shape
    n = len(layers)
    blocked_idx = {i + n if i < 0 else i for i in plan.blocks}
    for i, layer in enumerate(layers):
        shapes.append(shape)
        if i in blocked_idx and hasattr(layer, "units"):
            shape = tuple(shape[:-1]) + (int(layer.units),)
        else:
            try:
                shape = layer.build(shape, dtype)
            except ValueError as exc:
                raise ValueError(f"layer {i} ({type(layer).__name__}): {exc}") from exc
    return shapes, shape


def check_inputs(X: Any, input_shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """``X`` as an array of ``(N, *input_shape)`` of ``dtype``."""
    from sparknet._validation import check_array, refuse_spark

    refuse_spark(X, "X", part="model_parallel")
    return check_array(X, name="X", sample_shape=input_shape, dtype=dtype)


def check_outputs(y: Any, n: int, lo: Loss, output_shape: tuple[int, ...],
                  dtype: np.dtype) -> np.ndarray:
    """``y`` for ``n`` rows: class ids below the output's width (a classification loss ``lo``)
    or targets shaped like the output."""
    from sparknet._validation import check_labels, check_targets

    if lo.is_classification:
        return check_labels(y, n, output_shape[-1], name="y", lead_shape=output_shape[:-1])
    return check_targets(y, n, output_shape, dtype, name="y")
