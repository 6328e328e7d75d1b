"""What a model-parallel stage is (:class:`Stage`) and what it needs of the model it is
built for (:class:`StageOwner`): the stages (:mod:`~sparknet.cluster.model_parallel.stages`)
reach the model through this interface only."""
from __future__ import annotations

from typing import Protocol

import numpy as np

from sparknet.cluster.model_parallel.block_partition import BlockedLayer
from sparknet.cluster.model_parallel.jobs import BlockJob, Layout, Piece
from sparknet.cluster.model_parallel.messages import JobInputs
from sparknet.layers.base import Layer
from sparknet.optim import Optimizer


class StageOwner(Protocol):
    """What the stages need of the model they are built for, and all they reach of it
    (:class:`~sparknet.cluster.model_parallel.ModelParallel` is one).

    Attributes:
        layers: the network's layers, in order.
        blocked: the layers cut into neuron blocks (the plan, resolved).
        stages: the stages built for it (:func:`build_stages`).
        layout: the slots of ``(replica, block)``.
        n_slots: how many slots the layout has.
        dtype: the network's float type.
        seed: the network's seed (each layer's initial weights and dropout draws).
        job_optimizer: the optimizer the blocks step with (its config travels in the jobs).
        t: the optimizer steps taken.
        generation: this model's run, named in its jobs (a slot's state of another run is lost).
    """

    layers: list[Layer]
    blocked: list[BlockedLayer]
    stages: list[Stage]
    layout: Layout
    n_slots: int
    dtype: np.dtype
    seed: int
    job_optimizer: Optimizer
    t: int
    generation: int

    def new_optimizer(self) -> Optimizer:
        """A fresh optimizer of the model's configuration (a driver stage's own)."""
        ...

    def run_job(self, job: BlockJob, data: JobInputs, readers: int,
                defer: bool = False) -> list:
        """Run ``job`` on every slot with ``data``; its replies, in slot order."""
        ...

    def shards(self, n: int) -> tuple[int, ...] | None:
        """The replicas' row boundaries for a batch of ``n`` rows (``None``: one replica)."""
        ...

    def step_of(self, layer: BlockedLayer) -> int:
        """The optimizer step ``layer``'s next update is."""
        ...

    def advance(self, layer: BlockedLayer) -> None:
        """Count an update of ``layer``."""
        ...

    def pieces(self, layers: tuple[BlockedLayer, ...]) -> tuple[Piece, ...]:
        """The pieces the gradients of ``layers`` are combined over the replicas in."""
        ...

    def count_combined(self, n: int) -> None:
        """Count ``n`` bytes moved while combining gradients over the replicas."""
        ...


class Stage(Protocol):
    """One step of the network's forward and backward pass."""

    kind: str

    def forward(self, x: np.ndarray, training: bool) -> np.ndarray:
        """The stage's output for ``x``; with ``training`` it keeps what backward needs."""
        ...

    def backward(self, g: np.ndarray, need_dx: bool,
                 next_x: np.ndarray | None = None) -> np.ndarray | None:
        """Backpropagate the output delta ``g``, update the stage's weights, and return the
        input delta (``None`` unless ``need_dx``).  A blocked stage may run the forward of
        ``next_x`` in the same job (lookahead)."""
        ...
