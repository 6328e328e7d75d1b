"""The partitions' resident optimizer state (``sync="average"`` and ``mode="async"``): the
executor-side jobs that copy it out for a checkpoint and put it back after a resume or a
rebuild, and :class:`PartitionStates`, its part of a checkpoint (arrays
``part<p>_<name>``, :mod:`sparknet.stateful`)."""
from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Mapping

import numpy as np

from sparknet.cluster.data_parallel.round_task import STATE_PREFIX

if TYPE_CHECKING:
    from sparknet.cluster.resident.driver import Shard

#: checkpoint arrays of the partitions' state start with this (``part00003_square_avg``)
ARRAY_PREFIX = "part"


def state_prefix(key: str) -> str:
    """Names of fit ``key``'s optimizer state next to each shard start with this."""
    return f"{STATE_PREFIX}{key}-"


class CollectState:
    """Executor side: one partition's resident optimizer state of a fit, as copies."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    def __call__(self, index: int, shard: "Shard") -> dict[str, np.ndarray]:
        out = {}
        for name in sorted(shard.names()):
            if name.startswith(self.prefix):
                arr = shard.get(name)
                if arr is not None:
                    out[name[len(self.prefix):]] = np.array(arr, copy=True)
        return out


class PushState:
    """Executor side: put a partition's optimizer state (from a ``Broadcast`` of
    ``{partition: {name: array}}``) back next to its shard under the fit's prefix."""

    def __init__(self, prefix: str, bc: Any) -> None:
        self.prefix, self.bc = prefix, bc

    def __call__(self, index: int, shard: "Shard") -> list[int]:
        if index not in self.bc.value:
            return [0]  # a partition whose state was kept
        mine = self.bc.value[index]
        for name in [n for n in shard.names() if n.startswith(STATE_PREFIX)]:
            shard.discard(name)  # another fit's, or a rebuilt shard's half-written state
        for name, arr in mine.items():
            dst = shard.ensure(self.prefix + name, arr.shape, arr.dtype)
            np.copyto(dst, arr)
        return [len(mine)]


def array_names(partitions: list[int]) -> tuple[str, ...]:
    """The prefixes of the checkpoint arrays holding ``partitions``' state."""
    return tuple(f"{ARRAY_PREFIX}{p:05d}_" for p in partitions)


class PartitionStates:
    """The partitions' optimizer states as one part of a checkpoint
    (:class:`sparknet.stateful.Stateful`): ``states`` maps a partition to its named arrays;
    its state dict names them ``<partition:05d>_<name>`` (``part`` prefixes them in the file)."""

    def __init__(self, states: Mapping[int, Mapping[str, np.ndarray]] | None = None) -> None:
        self.states: dict[int, dict[str, np.ndarray]] = {p: dict(d)
                                                         for p, d in (states or {}).items()}

    def state_dict(self) -> dict[str, Any]:
        return {f"{p:05d}_{name}": arr for p, d in sorted(self.states.items())
                for name, arr in d.items()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.states = {}
        for key, arr in state.items():
            m = re.fullmatch(r"(\d{5})_(.+)", key)
            if m is None or not isinstance(arr, np.ndarray):
                raise ValueError(f"partition state {key!r} is not a partition's array "
                                 f"('<partition:05d>_<name>')")
            self.states.setdefault(int(m.group(1)), {})[m.group(2)] = arr
