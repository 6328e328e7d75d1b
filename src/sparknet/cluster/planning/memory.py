"""What a training plan needs in memory per executor, and what an executor may use.

The planner (:mod:`sparknet.cluster.planning.planner`) rules out candidates whose need exceeds the
executors' memory."""
from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparknet.cluster.planning.candidates import DenseLayout
    from sparknet.cluster.planning.cost import NetworkCosts, SparkCosts

#: the data-parallel modes: every task holds the whole model
DATA_PARALLEL = ("gradient", "average", "async")
#: optimizer state kept per parameter (RMSprop's running average) besides weights and gradient
_STATE_SLOTS = 1


def memory_need(mode: str, net: "NetworkCosts", settings: dict, samples: int, sample_bytes: float,
                sc: "SparkCosts", layout: "DenseLayout | None" = None) -> float:
    """Bytes one executor needs for a candidate: per data-parallel task the parameters
    (broadcast copy, the task's model, its gradient or delta, the optimizer state), its
    shard and a minibatch's activations; per block slot its weights and optimizer state
    and the batch's activations at its layers.  Tasks spread evenly over the executors."""
    state = 2 + _STATE_SLOTS
    # kept for backward, and the deltas
    acts = net.batch_size * float(sum(net.activation_bytes)) * 2
    executors = max(1, min(sc.executors, sc.hosts) if sc.hosts > 1 else sc.executors)
    if mode in DATA_PARALLEL:
        P = int(settings["partitions"])
        per_task = (state + 1) * net.param_bytes + math.ceil(samples / P) * sample_bytes + acts
        return per_task * math.ceil(P / executors)
    assert layout is not None
    K, D = int(settings["blocks"]), int(settings.get("replicas", 1))
    itemsize = net.param_bytes / max(net.n_params, 1) if net.n_params else 4.0
    blocked = layout.blocked_params() * itemsize
    per_slot = state * blocked / K + acts / D
    return per_slot * math.ceil(K * D / executors)


def memory_per_executor(spark: Any) -> float | None:
    """Bytes an executor may use: ``spark.executor.pyspark.memory`` per task slot when set,
    else this host's memory (local mode) or ``spark.executor.memory`` and its overhead."""
    sc = spark.sparkContext if hasattr(spark, "sparkContext") else spark
    conf, local = sc.getConf(), str(sc.master).startswith("local")
    py = conf.get("spark.executor.pyspark.memory", None)
    if py:
        return _bytes(py) * max(1, int(sc.defaultParallelism) if local
                                else int(conf.get("spark.executor.cores", "1")))
    if local:
        if not hasattr(os, "sysconf"):
            return None
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    mem = _bytes(conf.get("spark.executor.memory", "1g"))
    return mem + max(384 << 20, 0.1 * mem)


def _bytes(text: str) -> float:
    """``"512m"``, ``"2g"``, ``"1024k"`` or plain MiB -> bytes (Spark's size strings)."""
    t = str(text).strip().lower().rstrip("b")
    scale = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
    if t and t[-1] in scale:
        return float(t[:-1]) * scale[t[-1]]
    return float(t) * (1 << 20)
