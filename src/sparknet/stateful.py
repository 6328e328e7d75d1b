"""The state of a training run, composed from the state of its parts.

Each stateful part of a fit -- the model (parameters, layer statistics, random
generator), its optimizer, the outer optimizer, the partitions' optimizer states, the
position in the data, the history -- gives its state with ``state_dict()`` and takes it
back with ``load_state_dict(state)``, as PyTorch's modules and optimizers do and as its
distributed checkpoint composes them.  A state dict maps names to numpy arrays (the
part's numbers) or to JSON-able values (its counters and settings).

A checkpoint writer names its parts (:class:`Part`: a name, the prefix of its arrays, the
object) and :func:`compose` splits their states into the arrays of the checkpoint's
array file, ``<prefix><key>``, and its JSON metadata, ``meta[<name>][<key>]``;
:func:`state_of` gives one part its state back from what was read.  No writer reaches into
a part: a part that keeps something new puts it in its own state dict.

>>> import numpy as np
>>> from sparknet.optim import SGD
>>> opt = SGD(lr=0.1, momentum=0.9)
>>> opt.step(np.zeros(3), np.ones(3))  # False: no bf16 copies to refill
False
>>> arrays, meta = compose([Part("optimizer", "opt_", opt)])
>>> sorted(arrays), meta["optimizer"]["t"]
(['opt_momentum_buffer'], 1)
>>> fresh = SGD(lr=0.1, momentum=0.9)
>>> fresh.load_state_dict(state_of(Part("optimizer", "opt_", fresh), arrays, meta))
>>> fresh.t
1
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

import numpy as np


@runtime_checkable
class Stateful(Protocol):
    """A part of a training run that gives and takes its own state."""

    def state_dict(self) -> dict[str, Any]:
        """The part's state: arrays (copies) and JSON-able values."""
        ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Take back what :meth:`state_dict` gave (checked: ``ValueError`` naming what
        is wrong)."""
        ...


@dataclass(frozen=True)
class Part:
    """One stateful part of a checkpoint.

    Attributes:
        name: its key in the checkpoint's metadata.
        prefix: the names of its arrays in the array file start with this; an array
            belongs to the part with the longest prefix it starts with (one part may
            have the empty prefix).
        obj: the part.
    """

    name: str
    prefix: str
    obj: Stateful


def compose(parts: Sequence[Part]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """The arrays and the metadata of a checkpoint holding ``parts``.

    Raises:
        ValueError: two parts share a name, or two arrays would share a file name.
    """
    arrays: dict[str, np.ndarray] = {}
    meta: dict[str, Any] = {}
    for part in parts:
        if part.name in meta:
            raise ValueError(f"two parts of a checkpoint are named {part.name!r}")
        values: dict[str, Any] = {}
        for key, value in part.obj.state_dict().items():
            if isinstance(value, np.ndarray):
                name = part.prefix + key
                if name in arrays:
                    raise ValueError(f"checkpoint array {name!r} of part {part.name!r} is given "
                                     "twice")
                arrays[name] = value
            else:
                values[key] = value
        meta[part.name] = values
    return arrays, meta


def owner(name: str, parts: Sequence[Part]) -> Part | None:
    """The part an array named ``name`` belongs to: the longest prefix it starts with."""
    best: Part | None = None
    for part in parts:
        if name.startswith(part.prefix) and (best is None or len(part.prefix) > len(best.prefix)):
            best = part
    return best


def state_of(part: Part, arrays: Mapping[str, np.ndarray], meta: Mapping[str, Any],
             parts: Sequence[Part] = ()) -> dict[str, Any]:
    """``part``'s state dict from a checkpoint's ``arrays`` and ``meta``; ``parts`` (all
    the checkpoint's parts) settle which arrays are ``part``'s when prefixes nest."""
    state: dict[str, Any] = dict(meta.get(part.name) or {})
    for name, arr in arrays.items():
        if name.startswith(part.prefix) and (not parts or owner(name, parts) is part):
            state[name[len(part.prefix):]] = arr
    return state
