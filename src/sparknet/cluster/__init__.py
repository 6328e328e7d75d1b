"""Training on Apache Spark: data parallelism (:mod:`~sparknet.cluster.data_parallel`),
the parameter server (:mod:`~sparknet.cluster.params`), state resident on executors
(:mod:`~sparknet.cluster.resident`), Spark-session helpers
(:mod:`~sparknet.cluster.session`), the cost model of every mode (:mod:`~sparknet.cluster.cost`),
the planner (:mod:`~sparknet.cluster.planner`, ``plan``) and the cluster simulation
(:mod:`~sparknet.cluster.simulate`).

Names are imported lazily, so ``import sparknet.cluster`` does not start the JVM.
"""
from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "get_spark": "session", "check_java": "session", "JavaNotFoundError": "session",
    "Resident": "resident", "Shard": "resident", "ShardInfo": "resident",
    "ResidentStateLost": "resident",
    "DataParallelTrainer": "data_parallel", "demo": "demo_job",
    "ParameterServer": "params",
    "RoundCostModel": "cost", "SparkCosts": "cost", "NetworkCosts": "cost", "Prediction": "cost",
    "predict": "cost", "plan": "planner", "Plan": "planner",
    "ModelParallel": "model_parallel", "BlockPlan": "blocks",
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
