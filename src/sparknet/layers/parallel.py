"""``Parallel``: stacks of layers run side by side on one input, their outputs merged.

``Parallel([f, g, ...], merge)`` computes ``merge(f(x), g(x), ...)``, where each branch is
a list of layers run in order (an empty list is the input itself) and ``merge`` is

- ``"concat"``: side by side on the last axis (features, channels), as ``torch.cat(...,
  dim=1)`` of channels-first tensors, Keras' ``Concatenate``: Inception and DenseNet blocks
  (``Parallel([[], [BatchNormalization(), Conv2D(k, 3, padding="same")]])``), several
  views of one input;
- ``"multiply"``: element by element, Keras' ``Multiply``: gates, such as the SwiGLU of
  LLaMA-style Transformers, ``Parallel([[Dense(h, activation="silu")], [Dense(h)]],
  merge="multiply")`` then ``Dense(d)``;
- ``"add"``: the sum (``Residual`` is the two-branch case with the input as one branch).

Branch ``b``'s layer ``i`` has its parameters and state under ``"b.i."`` (``"1.0.kernel"``).
"""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from sparknet.layers.base import Layer, register
from sparknet.layers.container import Container

__all__ = ["Parallel"]

MERGES = ("concat", "multiply", "add")


@register
class Parallel(Container):
    """Branches of layers on one input, merged: ``merge(f_1(x), ..., f_n(x))``.

    Each layer of a branch that supports masks gets the mask of its input; the block hands
    its input's mask on.

    Args:
        branches: two or more lists of layers (an empty list: the input itself); no layer
            in two places.
        merge: ``"concat"`` (on the last axis; the branches' outputs must agree on the other
            axes), ``"multiply"`` or ``"add"`` (the outputs must have one shape).
        name: layer name.

    Input shape: any ``(N, ...)`` the branches take.  Output shape: the branches' shape,
    with ``"concat"`` the sum of their last axes.

    Raises:
        ValueError: fewer than two branches, a branch that is not a list of layers, a layer
            used twice, an unknown ``merge`` (at construction); outputs that cannot be
            merged (when built, naming the block and each branch's shape).
    """

    supports_masking = True

    def __init__(self, branches: Sequence[Sequence[Layer]], merge: str = "concat",
                 name: str | None = None) -> None:
        super().__init__(name)
        if not isinstance(branches, (list, tuple)) or len(branches) < 2:
            raise ValueError(f"Parallel branches must be a list of two or more lists of layers, "
                             f"got {branches!r}")
        if merge not in MERGES:
            raise ValueError(f"Parallel merge must be one of {', '.join(map(repr, MERGES))}, "
                             f"got {merge!r}")
        self.merge = merge
        seen: set[int] = set()
        for b, branch in enumerate(branches):
            stack = self.check_stack(branch, f"Parallel branches[{b}]", seen, empty=True)
            self.children.update({f"{b}.{i}": layer for i, layer in enumerate(stack)})
        self.n_branches = len(branches)

    @property
    def branches(self) -> list[list[Layer]]:
        """Each branch's layers, first to last (an empty list: the input itself)."""
        out: list[list[Layer]] = [[] for _ in range(self.n_branches)]
        for prefix, layer in self.children.items():
            out[int(prefix.split(".")[0])].append(layer)
        return out

    def _build(self, input_shape: tuple[int, ...]) -> tuple[int, ...]:
        shapes = []
        for b, branch in enumerate(self.branches):
            shape = tuple(input_shape)
            for i in range(len(branch)):
                shape = tuple(self._build_child(f"{b}.{i}", shape))
            shapes.append(shape)
        self._widths = [s[-1] if s else 1 for s in shapes]
        same = {s[:-1] for s in shapes} if self.merge == "concat" else set(shapes)
        if len(same) != 1 or any(not s for s in shapes):
            what = ("join on the last axis, so they must agree on the others" if
                    self.merge == "concat" else f"{self.merge} element by element, so they "
                    f"must have one shape")
            raise ValueError(f"Parallel {self.name!r}: its branches' outputs, "
                             f"{', '.join(map(str, shapes))}, {what}")
        if self.merge == "concat":
            return (*shapes[0][:-1], sum(self._widths))
        return shapes[0]

    def check_input(self, x: np.ndarray) -> None:
        """The first layer's checks of a whole input array (the block as a model's first
        layer)."""
        first = next((branch[0] for branch in self.branches if branch), None)
        if first is not None:
            first.check_input(x)

    # -- computation ------------------------------------------------------
    def forward(self, x: np.ndarray, training: bool = False,
                mask: np.ndarray | None = None) -> np.ndarray:
        self._check_built()
        outs = [self._forward_stack(branch, x, training, mask) if branch else x
                for branch in self.branches]
        self._outs = outs if self.merge == "multiply" else None
        if self.merge == "concat":
            return np.concatenate(outs, axis=-1, dtype=self.dtype)
        y = np.array(outs[0], dtype=self.dtype, copy=True)
        for h in outs[1:]:
            if self.merge == "add":
                y += h
            else:
                y *= h
        return y

    def backward(self, dy: np.ndarray) -> np.ndarray | None:
        dy = np.asarray(dy, dtype=self.dtype)
        dx: np.ndarray | None = None
        edges = np.cumsum([0] + self._widths)
        for b, branch in enumerate(self.branches):
            if self.merge == "concat":
                g = np.ascontiguousarray(dy[..., edges[b]:edges[b + 1]])
            elif self.merge == "add":
                g = np.array(dy, order="C", copy=True)
            else:   # the product of the other branches' outputs
                assert self._outs is not None
                g = np.array(dy, order="C", copy=True)
                for k, h in enumerate(self._outs):
                    if k != b:
                        g *= h
            d = self._backward_stack(branch, g) if branch else (
                g if self.need_input_grad else None)
            if d is not None:
                dx = d.reshape(dy.shape[:1] + self._shapes()[0]) if dx is None else (
                    dx + d.reshape(dx.shape))
        return dx

    def __repr__(self) -> str:
        inner = ", ".join("[" + ", ".join(repr(layer) for layer in branch) + "]"
                          for branch in self.branches)
        return f"Parallel([{inner}], merge={self.merge!r})"

    # -- (de)serialisation ------------------------------------------------
    def get_config(self) -> dict[str, Any]:
        return {"branches": [self.children_to_config(branch) for branch in self.branches],
                "merge": self.merge, "name": self.name}

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> "Parallel":
        config = dict(config)
        where = f"Parallel {config.get('name', 'parallel')!r} branches"
        specs = config.pop("branches", None)
        if not isinstance(specs, (list, tuple)):
            raise ValueError(f"{where}: expected a list of lists of layer configs, got {specs!r}")
        branches = [cls.children_from_config(s, f"{where}[{b}]") for b, s in enumerate(specs)]
        return cls(branches, **config)
