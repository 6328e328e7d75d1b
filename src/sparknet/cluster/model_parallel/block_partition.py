"""Neuron-block plans: which dense layers of a model are cut into blocks, and how.

A blocked :class:`~sparknet.layers.Dense` layer with kernel ``W`` of shape
``(out, in)`` is cut into ``K`` *row blocks*: block ``k`` owns the output neurons
``rows[k]:rows[k + 1]``, i.e. ``W[rows[k]:rows[k + 1], :]`` and the matching bias
entries.  Each block lives on one executor *slot* (slot ``k`` holds block ``k`` of
every blocked layer), so the blocks of a layer run in parallel.

Two consecutive blocked layers may be *paired* (Megatron-style tensor
parallelism): the first is cut by output neurons as above, the second by
*input* neurons, block ``k`` owning the columns ``W2[:, rows[k]:rows[k + 1]]`` that
read exactly the neurons block ``k`` of the first layer computes.  The hidden
activations of the pair then never leave their executor: a pair costs one
exchange with the driver (broadcast the input, sum the partial outputs)
instead of two.  The second layer's bias is tiny and stays on the driver.

Example::

    plan = BlockPlan({0: 2, 1: 2}, pair=True)   # layers 0 and 1 in 2 blocks, paired
    plan = BlockPlan({1: 4})                    # only layer 1, in 4 row blocks
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

import numpy as np

#: activations a block may apply on its own (elementwise); softmax needs the whole row
ELEMENTWISE = ("identity", "relu", "tanh", "sigmoid")


def split_sizes(n: int, k: int) -> np.ndarray:
    """Offsets ``[0, ..., n]`` (length ``k + 1``) of ``k`` near-equal contiguous blocks of ``n``.

    The first ``n % k`` blocks get one extra element, like :func:`numpy.array_split`.

    Raises:
        ValueError: if ``k`` is not in ``[1, n]``.
    """
    n, k = int(n), int(k)
    if k < 1 or k > n:
        raise ValueError(f"cannot cut {n} neurons into {k} blocks (need 1 <= blocks <= {n})")
    base, extra = divmod(n, k)
    sizes = np.full(k, base, dtype=np.int64)
    sizes[:extra] += 1
    return np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)


@dataclass(frozen=True)
class BlockedLayer:
    """One blocked dense layer of a resolved plan.

    Attributes:
        index: the layer's position in the model.
        blocks: number of blocks ``K``.
        units: output neurons of the layer.
        in_features: input features of the layer.
        activation: the layer's activation name.
        use_bias: whether the layer has a bias.
        kernel_initializer: initializer name (``"auto"`` resolved).
        cut: ``"rows"`` (by output neurons) or ``"cols"`` (by input neurons: the
            second layer of a pair).
        offsets: ``K + 1`` offsets of the cut axis.
        partner: index of the other layer of the pair, or ``None``.
        emit_logits: the layer is the model's softmax head and emits logits.
    """

    index: int
    blocks: int
    units: int
    in_features: int
    activation: str
    use_bias: bool
    kernel_initializer: str
    cut: str
    offsets: tuple[int, ...]
    partner: int | None = None
    emit_logits: bool = False

    @property
    def n_params(self) -> int:
        """Parameters of the whole layer (kernel and bias)."""
        return self.units * self.in_features + (self.units if self.use_bias else 0)

    @property
    def kernel_activation(self) -> int:
        """The activation id a block applies itself (identity for a softmax head that emits
        logits: the softmax is fused with the loss on the driver)."""
        from sparknet.activations import activation_id

        return 0 if (self.emit_logits
                     and self.activation == "softmax") else activation_id(self.activation)

    def span(self, k: int) -> tuple[int, int]:
        """``(lo, hi)``: the neurons (rows cut) or input features (cols cut) of block ``k``."""
        return int(self.offsets[k]), int(self.offsets[k + 1])

    def block_shape(self, k: int) -> tuple[int, int]:
        """Shape of block ``k``'s kernel slice."""
        lo, hi = self.span(k)
        if self.cut == "rows":
            return (hi - lo, self.in_features)
        return (self.units, hi - lo)

    def param_shapes(self, k: int) -> dict[str, tuple[int, ...]]:
        """``{"kernel": shape, "bias": shape}`` of the parameters block ``k`` holds (a column
        block holds no bias: the second layer of a pair keeps its bias on the driver)."""
        shapes: dict[str, tuple[int, ...]] = {"kernel": self.block_shape(k)}
        if self.cut == "rows" and self.use_bias:
            shapes["bias"] = (self.block_shape(k)[0],)
        return shapes

    def to_dict(self) -> dict:
        """JSON-able description (shipped to executors and stored in block files)."""
        return {"index": self.index, "blocks": self.blocks, "units": self.units,
                "in_features": self.in_features, "activation": self.activation,
                "use_bias": self.use_bias, "kernel_initializer": self.kernel_initializer,
                "cut": self.cut, "offsets": [int(o) for o in self.offsets],
                "partner": self.partner, "emit_logits": self.emit_logits}


@dataclass
class BlockPlan:
    """Which dense layers are cut into neuron blocks, and into how many.

    Args:
        blocks: ``{layer_index: K}``: cut model layer ``layer_index`` (a
            :class:`~sparknet.layers.Dense`) into ``K`` blocks of output neurons.
            Negative indices count from the end.
        pair: pair consecutive blocked layers with the same ``K`` (first cut by output
            neurons, second by input neurons) so that a pair costs one exchange.
            ``True`` pairs greedily from the first layer; a list of ``(i, i + 1)``
            tuples pairs exactly those.

    Raises:
        ValueError: on a non-integer index, a block count below 1, or a bad pair.
    """

    blocks: Mapping[int, int]
    pair: "bool | Sequence[tuple[int, int]]" = False
    _resolved: list = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.blocks, Mapping) or not self.blocks:
            raise ValueError(f"BlockPlan needs a non-empty mapping {{layer_index: blocks}}, got "
                             f"{self.blocks!r}")
        clean = {}
        for idx, k in self.blocks.items():
            if isinstance(idx, bool) or not isinstance(idx, (int, np.integer)):
                raise ValueError(f"BlockPlan layer index must be an integer, got {idx!r}")
            if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
                raise ValueError(f"BlockPlan: layer {idx} needs a positive integer block count, "
                                 f"got {k!r}")
            clean[int(idx)] = int(k)
        self.blocks = clean
        if not isinstance(self.pair, bool):
            pairs = []
            for p in self.pair:
                if len(p) != 2 or int(p[1]) != int(p[0]) + 1:
                    raise ValueError(f"BlockPlan pair {p!r} must be two consecutive layer indices "
                                     "(i, i + 1)")
                pairs.append((int(p[0]), int(p[1])))
            self.pair = pairs

    @property
    def max_blocks(self) -> int:
        """The number of executor slots the plan needs (its largest ``K``)."""
        return max(self.blocks.values())

    def to_dict(self) -> dict:
        return {"blocks": {str(k): v for k, v in self.blocks.items()},
                "pair": self.pair if isinstance(self.pair, bool) else [list(p) for p in self.pair]}

    @classmethod
    def from_dict(cls, d: dict) -> "BlockPlan":
        pair = d.get("pair", False)
        return cls({int(k): int(v) for k, v in d["blocks"].items()},
                   pair=pair if isinstance(pair, bool) else [tuple(p) for p in pair])

    def resolve(self, layers: Sequence, shapes: Sequence[tuple[int, ...]],
                softmax_head: bool) -> list[BlockedLayer]:
        """Check the plan against built layer shapes and return the blocked layers.

        Args:
            layers: the model's layers (need not be built).
            shapes: per-sample input shape of every layer.
            softmax_head: the model's last layer is a softmax fused with the loss.

        Returns:
            The :class:`BlockedLayer` descriptions, sorted by layer index.

        Raises:
            ValueError: a blocked layer is not a Dense layer, has a softmax that is not
                the model's head, has more blocks than neurons, or a pair is invalid.
        """
        from sparknet.layers.core import Dense

        n = len(layers)
        idx = {}
        for i, k in self.blocks.items():
            j = i + n if i < 0 else i
            if not 0 <= j < n:
                raise ValueError(f"BlockPlan: layer index {i} is out of range for a model of {n} "
                                 "layers")
            if j in idx:
                raise ValueError(f"BlockPlan: layer {j} is listed twice")
            idx[j] = k
        for j in idx:
            if type(layers[j]) is not Dense:
                raise ValueError(f"BlockPlan: layer {j} is {type(layers[j]).__name__}; only Dense "
                                 f"layers can be cut into neuron blocks")
        if self.pair is True:
            pairs, j = [], 0
            while j < n:
                if j in idx and j + 1 in idx and idx[j] == idx[j + 1]:
                    pairs.append((j, j + 1))
                    j += 2
                else:
                    j += 1
        elif self.pair is False:
            pairs = []
        else:
            pairs = [(a + n if a < 0 else a, b + n if b < 0 else b) for a, b in self.pair]
        seen: set[int] = set()
        for a, b in pairs:
            if a not in idx or b not in idx:
                raise ValueError(f"BlockPlan pair ({a}, {b}): both layers must be blocked")
            if idx[a] != idx[b]:
                raise ValueError(f"BlockPlan pair ({a}, {b}): both layers need the same block "
                                 f"count, got {idx[a]} and {idx[b]}")
            if a in seen or b in seen:
                raise ValueError(f"BlockPlan pair ({a}, {b}) overlaps another pair")
            seen.update((a, b))
        first = {a: b for a, b in pairs}
        second = {b: a for a, b in pairs}
        out = []
        for j in sorted(idx):
            layer, k = layers[j], idx[j]
            in_f = int(shapes[j][-1])
            head = softmax_head and j == n - 1
            act = layer.activation
            if act not in ELEMENTWISE and not head:
                why = ("whose derivative needs the pre-activation, which a block does not keep "
                       f"(an Activation({act!r}) layer after it does)"
                       if act != "softmax" else "which needs whole rows")
                raise ValueError(f"BlockPlan: layer {j} has activation {act!r}, {why}; a blocked "
                                 f"layer may use {', '.join(ELEMENTWISE)} (softmax only as the "
                                 f"model's last layer)")
            init = layer.kernel_initializer
            if init == "auto":
                init = "he_uniform" if act == "relu" else "glorot_uniform"
            cut = "cols" if j in second else "rows"
            cut_n = in_f if cut == "cols" else layer.units
            try:
                offs = split_sizes(cut_n, k)
            except ValueError as exc:
                raise ValueError(f"BlockPlan: layer {j}: {exc}") from exc
            out.append(BlockedLayer(index=j, blocks=k, units=layer.units, in_features=in_f,
                                    activation=act, use_bias=layer.use_bias,
                                    kernel_initializer=init, cut=cut,
                                    offsets=tuple(int(o) for o in offs),
                                    partner=first.get(j, second.get(j)), emit_logits=head))
        self._resolved = out
        return out


def as_plan(plan: "BlockPlan | Mapping[int, int]",
            pair: "bool | Sequence[tuple[int, int]] | None" = None) -> BlockPlan:
    """A :class:`BlockPlan` from a plan or a ``{layer_index: K}`` mapping."""
    if isinstance(plan, BlockPlan):
        if pair is not None:
            return BlockPlan(dict(plan.blocks), pair=pair)
        return plan
    if isinstance(plan, Mapping):
        return BlockPlan(dict(plan), pair=bool(pair) if isinstance(pair, bool)
                         or pair is None else pair)
    raise ValueError(f"blocks must be a BlockPlan or a {{layer_index: blocks}} mapping, got "
                     f"{plan!r}")
