"""bfloat16 on the wire: a round's deltas sent back to the driver in half the bytes.

With ``DataParallelTrainer(..., wire="bf16")`` every training task of ``sync="average"`` and
``mode="async"`` sends its row-weighted delta as bfloat16 bit patterns (``uint16``, two bytes a
value in place of four) instead of float32.  How it works:

* **Rounding to nearest even** (:func:`sparknet._bf16.to_bf16`): a value keeps its float32
  exponent and loses the low 16 bits of its mantissa, a relative error of at most ``2**-9``; a
  small delta stays small, never zero (except float32 denormals, flushed to zero).
* **Error feedback**: a task adds the rounding error its partition left in the previous round
  (kept resident next to its shard, like its optimizer state) before rounding, and keeps the new
  error for the next round.  So the rounding errors do not accumulate: what the driver has applied
  after ``k`` rounds differs from the float32 sum of the deltas by one round's rounding at most.
* **The driver stays float32**: :func:`decode` turns each task's vector back into float32 as it
  is summed (:meth:`~sparknet.cluster.data_parallel.parameter_server.RoundResult.add`); the sums,
  the parameters and the outer optimizer's state are float32.  The first level of the tree
  aggregation (the task itself) keeps its vector encoded, so the bytes that cross the network
  are the halved ones
  (:attr:`~sparknet.cluster.data_parallel.parameter_server.ParameterServer.bytes_in` counts them).

``sync="gradient"`` (exact minibatch SGD) keeps float32 gradients: rounding them would break
its exactness, and it has no rounds of local steps to amortise the error over.
"""
from __future__ import annotations

from typing import Any

import numpy as np

import sparknet._bf16 as _bf16

#: the values ``wire=`` takes
WIRES = ("fp32", "bf16")
#: name (after the fit's state prefix) of a partition's rounding error kept next to its shard
RESIDUAL = "wire-residual"


def check_wire(value: Any, mode: str, sync: str) -> str:
    """``value`` when it is a valid ``wire=`` for this mode and sync; else ``ValueError``."""
    if not isinstance(value, str) or value not in WIRES:
        raise ValueError(f"wire must be 'fp32' or 'bf16', got {value!r}")
    if value == "bf16" and mode == "sync" and sync == "gradient":
        raise ValueError("wire='bf16' sends the deltas of sync='average' or mode='async' as "
                         "bfloat16; sync='gradient' (exact minibatch SGD) keeps float32 gradients: "
                         "use wire='fp32' with it, or sync='average'")
    return value


def encode(vec: np.ndarray, residual: np.ndarray | None = None) -> np.ndarray:
    """``vec + residual`` as bfloat16 bits (``uint16``), rounded to nearest even; ``residual``
    (float32, ``vec``'s size) becomes the rounding error of this call: ``e - decode(bits)``."""
    e = np.asarray(vec, dtype=np.float32).reshape(-1)
    if residual is not None:
        e = e + residual
    bits = _bf16.to_bf16(e)
    if residual is not None:
        np.subtract(e, _bf16.from_bf16(bits), out=residual)
    return bits


def is_encoded(vec: np.ndarray | None) -> bool:
    """Whether ``vec`` is bfloat16 bits (the only ``uint16`` vectors a round sends)."""
    return vec is not None and vec.dtype == np.uint16


def decode(vec: np.ndarray) -> np.ndarray:
    """float32 of an encoded vector; any other vector as it is."""
    return _bf16.from_bf16(vec) if is_encoded(vec) else vec
