"""The layers' untrained state (BatchNormalization's running statistics) in data-parallel
training: how it goes out with the parameters, how the partitions' states come back
combined, and how checkpoints hold it.

How it works
------------
* **Out.**  A round ships one flat vector: the parameters, followed by the model's
  :attr:`~sparknet.model.Sequential.state` when its layers keep any (:func:`shipped`); a
  task puts both into its copy of the model (:func:`load`), so training, gradient and
  evaluation tasks all start from the driver's state.  A model without state ships its
  parameters alone, as before.
* **Back.**  After a training task, the partition's state (updated in place by its
  ``forward(x, training=True)`` calls) travels in its
  :class:`~sparknet.cluster.data_parallel.parameter_server.RoundResult` with the rows it trained on
  (:func:`attach`).  Adding two results (``treeAggregate``, the accumulator, or the
  Connect client) keeps their row-weighted mean (:func:`merge`), so the round's sum holds
  the row-weighted mean of every partition's state; one partition's state comes back
  unchanged, bit for bit.
* **On the driver.**  Synchronous rounds (``sync="average"`` and ``sync="gradient"``)
  replace the model's state by that mean (:func:`take`).  With ``sync="gradient"`` each
  partition normalises its slice of the global minibatch by the slice's own batch
  statistics, as PyTorch's DistributedDataParallel does without ``SyncBatchNorm`` (with
  one partition: exactly one process's step); DDP keeps rank 0's running statistics,
  sparknet the row-weighted mean of all partitions'.  Asynchronous rounds
  (``mode="async"``) keep the newest state of every partition whose update was applied,
  with the rows of that round, and set the model's state to their row-weighted mean after
  each applied update (:class:`LatestStates`).
* **Local steps.**  Batch statistics need two rows: in the local steps of
  ``sync="average"`` and ``mode="async"`` rounds, a model whose layers keep state never
  trains on a minibatch of one row; a chunk's last minibatch of a single row takes the row
  before it too (:func:`minibatch`), so the step count and the schedule are unchanged.
* **Checkpoints** hold the state as the array ``state`` of the model's part
  (:meth:`sparknet.model.Sequential.state_dict`), so a resumed fit continues from it exactly.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from sparknet.cluster.data_parallel.parameter_server import RoundResult
    from sparknet.model import Sequential


def shipped(params: np.ndarray, state: np.ndarray) -> np.ndarray:
    """What a round sends out: ``params``, followed by ``state`` when it is not empty."""
    if state.size == 0:
        return np.ascontiguousarray(params)
    return np.concatenate([params, state])


def load(model: Sequential, vec: np.ndarray) -> None:
    """Executor side: the model's parameters (and state) from a :func:`shipped` vector."""
    n = model.n_params
    if vec.shape[0] == n:
        model.set_params(vec)
        return
    model.set_params(vec[:n])
    model.set_state(vec[n:])


def minibatch(rows: np.ndarray, lo: int, size: int, pairs: bool) -> np.ndarray:
    """Rows ``[lo, lo + size)`` of a chunk; with ``pairs`` (a model whose layers keep batch
    statistics), a last minibatch of one row takes the row before it too."""
    if pairs and lo > 0 and len(rows) - lo == 1:
        return rows[lo - 1:]
    return rows[lo:lo + size]


def attach(res: RoundResult, model: Sequential) -> None:
    """Executor side, after a training task: its state and the rows it trained on."""
    rows = res.stat("samples")
    if model.n_state and rows > 0:
        res.state, res.state_rows = np.array(model.state, copy=True), rows


def merge(a: np.ndarray | None, wa: float, b: np.ndarray | None,
          wb: float) -> tuple[np.ndarray | None, float]:
    """The row-weighted mean of state ``a`` (of ``wa`` rows) and ``b`` (of ``wb``), and
    its rows; a missing one leaves the other as it is (copied)."""
    if b is None or wb <= 0:
        return a, wa
    if a is None or wa <= 0:
        return np.array(b, copy=True), wb
    total = wa + wb
    mean = (wa / total) * a.astype(np.float64) + (wb / total) * b.astype(np.float64)
    return mean.astype(a.dtype), total


def take(model: Sequential, res: RoundResult) -> None:
    """Driver side, after a synchronous round: the model's state becomes the round's
    row-weighted mean of the partitions' states (unchanged when no partition trained)."""
    if res.state is not None and res.state_rows > 0:
        model.state[...] = res.state


class LatestStates:
    """The newest state of each partition of an asynchronous fit, with the rows of the
    round that produced it; the model's state is their row-weighted mean."""

    def __init__(self) -> None:
        self.latest: dict[int, tuple[np.ndarray, float]] = {}

    def arrive(self, partition: int, res: RoundResult, model: Sequential) -> None:
        """An applied update of ``partition``: keep its state, set the model's."""
        if res.state is None or res.state_rows <= 0:
            return
        self.latest[partition] = (res.state, res.state_rows)
        mean: np.ndarray | None = None
        rows = 0.0
        for state, n in self.latest.values():
            mean, rows = merge(mean, rows, state, n)
        assert mean is not None
        model.state[...] = mean
