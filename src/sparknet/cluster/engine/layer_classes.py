"""A network's own layer classes, sent to the executors with the network.

The executors rebuild a network from its architecture (JSON), looking each layer's class up
by name in :data:`sparknet.layers.base.REGISTRY`.  sparknet's own layers are there in every
process; a class the user wrote and registered (``@register``) is there only in the process
that ran its definition: the driver.  :func:`ship` pickles the classes an architecture names
that are not sparknet's (with pyspark's cloudpickle: a class defined in the driver's script or
inside a function travels by value, one defined in a module by reference, which the executor
imports), and :func:`register` registers them on the executor before the network is rebuilt.
A class that cannot be loaded there raises :class:`~sparknet.errors.WorkerSetupError` saying
how to make it importable; the driver raises it as itself
(:mod:`sparknet.cluster.engine.task_errors`).
"""
from __future__ import annotations

import pickle
from typing import Any

from sparknet.errors import WorkerSetupError
from sparknet.layers.base import REGISTRY, custom_layer_classes


def ship(config: Any) -> bytes:
    """The user's layer classes that the architecture ``config`` names, pickled (``b""``:
    none, the network is made of sparknet's layers)."""
    classes = custom_layer_classes(config)
    if not classes:
        return b""
    from pyspark import cloudpickle

    return cloudpickle.dumps(classes)


def register(payload: bytes) -> None:
    """Register the classes :func:`ship` pickled, in this (executor) process."""
    if not payload:
        return
    try:
        classes = pickle.loads(payload)
    except Exception as exc:
        raise WorkerSetupError(
            f"the executors cannot load the network's own layer classes ({type(exc).__name__}: "
            f"{exc}): a layer class defined in a module must be importable on the executors "
            f"(install the module there, or send it with spark.sparkContext.addPyFile"
            f"('<module>.py')); one defined in the driver's script travels with the network"
        ) from None
    REGISTRY.update(classes)
