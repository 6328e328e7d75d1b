"""The demo job: a small MLP trained on scikit-learn's digits by :class:`DataParallelTrainer`
(``python -m sparknet demo``, the README's first command)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from sparknet import optim as optim_mod
from sparknet.cluster.data_parallel.trainer import DataParallelTrainer
from sparknet.model import Sequential
from sparknet.progress import status

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def demo(spark: "SparkSession | None" = None, epochs: int = 35, seed: int = 0,
         num_partitions: int = 2, verbose: "int | bool" = 1) -> float:
    """Train a 64-128-10 MLP on scikit-learn's digits on Spark (tau-averaging rounds) and
    return its accuracy on the held-out quarter.

    Args:
        spark: a SparkSession (default: the active one, or a new ``local[*]`` one; Java
            17+ is checked first).
        epochs: passes over the training set (35 reach 97-98 %).
        seed: seeds the split, the initial weights and the shuffles.
        num_partitions: data shards.
        verbose: 0 nothing, 1 (default) one live progress bar and a line per epoch, 2 the
            lines alone (test accuracy shown as ``val_accuracy``).

    Returns:
        test accuracy.

    Raises:
        JavaNotFoundError: no Java 17+ when a new session is needed.
    """
    from sparknet.datasets import load_digits
    from sparknet.layers import Dense

    status("sparknet demo: loading scikit-learn's digits ...", verbose)
    X, y, Xt, yt = load_digits(seed=seed)
    model = Sequential([Dense(128, activation="relu"), Dense(10, activation="softmax")], seed=seed)
    trainer = DataParallelTrainer(model, spark, num_partitions=num_partitions, sync="average",
                                  optimizer=optim_mod.RMSprop(lr=3e-3))
    trainer.fit(X, y, epochs=epochs, batch_size=16, validation_data=(Xt, yt), verbose=verbose)
    return float(model.evaluate(Xt, yt)["accuracy"])
