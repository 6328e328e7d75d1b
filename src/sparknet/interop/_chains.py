"""What the two graph readers (:mod:`sparknet.interop._from_torch_graph` and
:mod:`sparknet.interop._keras_graph`) share: a network read as chains of steps from its
input, where two branches that meet part at the end of the steps their chains share."""

from __future__ import annotations

from typing import Any, Sequence

__all__ = ["shared_start"]


def shared_start(chains: Sequence[Sequence[Any]]) -> int:
    """How many leading steps every chain of ``chains`` shares (the same objects)."""
    n = 0
    while all(len(c) > n and c[n] is chains[0][n] for c in chains):
        n += 1
    return n
