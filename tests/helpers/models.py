"""The small networks the tests train: one builder, the sizes written at each call."""
from __future__ import annotations

from typing import Any

from sparknet import Dense, Sequential


def mlp(hidden: int, classes: int = 10, **kwargs: Any) -> Sequential:
    """``Dense(hidden, relu) -> Dense(classes, softmax)``; ``kwargs`` go to :class:`Sequential`
    (``seed``, ``dtype``, ``input_shape``; its defaults: seed 0, float32, shape from the data)."""
    return Sequential([Dense(hidden, activation="relu"), Dense(classes, activation="softmax")],
                      **kwargs)


def mp_layers() -> list[Dense]:
    """The model-parallel tests' network as a list of layers (``ModelParallel`` takes layers):
    ``Dense(40, tanh) -> Dense(24, relu) -> Dense(10, softmax)``."""
    return [Dense(40, activation="tanh"), Dense(24, activation="relu"),
            Dense(10, activation="softmax")]
