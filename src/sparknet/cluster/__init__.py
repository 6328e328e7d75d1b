"""Training on Apache Spark, in one sub-package per concern:

* :mod:`~sparknet.cluster.engine`: the seam to Spark (Classic and Spark Connect) and
  getting a session (:func:`get_spark`);
* :mod:`~sparknet.cluster.resident`: state held on the executors across jobs
  (:class:`Resident`);
* :mod:`~sparknet.cluster.data`: training data onto the executors (DataFrames, packed
  JVM rows, RDDs, numpy arrays);
* :mod:`~sparknet.cluster.planning`: the cost model of every mode (:func:`predict`), the
  planner (:func:`plan`) and the cluster simulation;
* :mod:`~sparknet.cluster.data_parallel`: :class:`DataParallelTrainer` and its parameter
  server, rounds, asynchronous mode, guards and checkpoints;
* :mod:`~sparknet.cluster.model_parallel`: :class:`ModelParallel` and its block plans
  (:class:`BlockPlan`).

Names are imported lazily, so ``import sparknet.cluster`` does not start the JVM.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "get_spark": "engine.session", "check_java": "engine.session",
    "JavaNotFoundError": "engine.session",
    "Resident": "resident.driver", "Shard": "resident.driver", "ShardInfo": "resident.driver",
    "ResidentStateLost": "resident.driver",
    "DataParallelTrainer": "data_parallel.trainer", "demo": "data_parallel.demo_job",
    "ParameterServer": "data_parallel.parameter_server",
    "RoundCostModel": "planning.cost", "SparkCosts": "planning.cost_inputs",
    "NetworkCosts": "planning.cost_inputs",
    "Prediction": "planning.cost", "predict": "planning.cost", "plan": "planning.planner",
    "Plan": "planning.planner", "ModelParallel": "model_parallel",
    "BlockPlan": "model_parallel.block_partition",
    "BlockStateLost": "model_parallel", "BlockMemoryError": "model_parallel",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    mod = _EXPORTS.get(name)
    if mod is None:
        raise AttributeError(f"module 'sparknet.cluster' has no attribute {name!r}")
    return getattr(importlib.import_module(f"sparknet.cluster.{mod}"), name)


def __dir__() -> list[str]:
    return sorted(list(globals()) + __all__)
