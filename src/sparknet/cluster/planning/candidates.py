"""The candidates the planner predicts: every ``(mode, settings)`` that applies to a model on a
cluster.

``"gradient"`` with partitions ``P``; ``"average"`` and ``"async"`` with ``P`` and ``tau``
(powers of two, and one, two and four epochs' steps: the trainer's longest round is four
epochs); ``"model_parallel"`` with blocks ``K`` and pairing of the large dense layers
(:data:`MIN_BLOCKED_PARAMS` parameters or more, described by a :class:`DenseLayout`) and
``"hybrid"`` with ``D x K``; each with BLAS threads per task ``T`` within the cores.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Sequence

from sparknet.cluster.planning.memory import DATA_PARALLEL

if TYPE_CHECKING:
    from sparknet.cluster.planning.cost import SparkCosts
    from sparknet.model import Sequential

#: the training modes the planner knows
MODES = ("gradient", "average", "async", "model_parallel", "hybrid")
#: a dense layer is worth cutting into blocks from this many parameters on
MIN_BLOCKED_PARAMS = 1 << 20


@dataclass(frozen=True)
class DenseLayout:
    """The dense layers of an all-dense model, as the cost model's model-parallel terms
    take them: ``widths`` ``[in, h1, ..., out]`` and the ``blocked`` layer indices."""

    widths: tuple[int, ...]
    blocked: tuple[int, ...]

    @property
    def pairable(self) -> bool:
        """Two consecutive layers are blocked (a Megatron pair is possible)."""
        return any(b == a + 1 for a, b in zip(self.blocked, self.blocked[1:]))

    @property
    def max_blocks(self) -> int:
        """The most blocks every blocked layer can be cut into (its fewest neurons)."""
        return min(self.widths[i + 1] for i in self.blocked)

    def blocked_params(self) -> int:
        """Parameters of the blocked layers."""
        return sum(self.widths[i] * self.widths[i + 1] + self.widths[i + 1] for i in self.blocked)


def _grid(n: int) -> list[int]:
    """1..n when small; else powers of two, their halves between, and n."""
    if n <= 16:
        return list(range(1, n + 1))
    out = {1, n}
    k = 1
    while k <= n:
        out.update({k, k + k // 2})
        k *= 2
    return sorted(x for x in out if 1 <= x <= n)


def _thread_options(sc: "SparkCosts", threads: Sequence[int] | None) -> list[int]:
    if threads is not None:
        bad = [t for t in threads if isinstance(t, bool) or not isinstance(t, int)
               or not 1 <= t <= sc.cores_per_host]
        if bad or not threads:
            raise ValueError(f"threads must be BLAS thread counts in [1, {sc.cores_per_host}], got "
                             f"{threads!r}")
        return sorted(set(threads))
    return sorted({t for t in (1, 2, 4, 8, 16, 32, 64)
                   if t <= sc.cores_per_host} | {sc.cores_per_host})


def _taus(samples: int, partitions: int, batch_size: int, taus: Sequence[int] | None) -> list[int]:
    if taus is not None:
        return list(taus)  # checked by plan_from_costs
    steps = max(1, math.ceil(math.ceil(samples / partitions) / batch_size))
    out = {steps, 2 * steps, 4 * steps}
    k = 1
    while k < steps:
        out.add(k)
        k *= 2
    return sorted(out)


def enumerate_candidates(modes: Sequence[str], sc: "SparkCosts", samples: int, batch_size: int, *,
                         max_partitions: int | None = None, taus: Sequence[int] | None = None,
                         threads: Sequence[int] | None = None,
                         layout: DenseLayout | None = None) -> Iterator[tuple[str, dict]]:
    """Every ``(mode, settings)`` worth predicting on the cluster ``sc``: partitions (and
    tau) for the data-parallel modes, ``K``/pairing and ``D x K`` for the blocked ones,
    each with the BLAS threads per task that fit the cores."""
    for t in _thread_options(sc, threads):
        slots = sc.hosts * (sc.cores_per_host // t)
        top = slots if max_partitions is None else min(slots, max_partitions)
        for P in _grid(top):
            if "gradient" in modes:
                yield "gradient", {"partitions": P, "threads": t}
            for mode in ("average", "async"):
                if mode in modes:
                    for tau in _taus(samples, P, batch_size, taus):
                        yield mode, {"partitions": P, "tau": tau, "threads": t}
        if layout is None:
            continue
        lay = {"layer_sizes": list(layout.widths), "blocked": list(layout.blocked)}
        pairs = (False, True) if layout.pairable else (False,)
        for K in _grid(min(top, layout.max_blocks)):
            for paired in pairs:
                if "model_parallel" in modes:
                    yield "model_parallel", {"blocks": K, "paired": paired, "threads": t, **lay}
                if "hybrid" in modes and K >= 2:
                    for D in _grid(top // K)[1:]:
                        yield "hybrid", {"blocks": K, "paired": paired, "replicas": D, "threads": t,
                                         **lay}


def check_modes(modes: Sequence[str] | None, layout: DenseLayout | None, slots: int,
                 why_not_blocked: str) -> list[str]:
    """The modes to consider (``None``: every one that applies), checked."""
    if modes is None:
        blocked = (["model_parallel"] + (["hybrid"] if slots >= 4
                                         else [])) if layout is not None else []
        return list(DATA_PARALLEL) + blocked
    if isinstance(modes, str) or not modes:
        raise ValueError(f"modes must be a non-empty list of {', '.join(map(repr, MODES))}, got "
                         f"{modes!r}")
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise ValueError(f"unknown mode(s) {bad!r}: modes must be among "
                         f"{', '.join(map(repr, MODES))}")
    if layout is None and any(m in ("model_parallel", "hybrid") for m in modes):
        raise ValueError(f"modes {list(modes)!r}: model parallelism does not apply to this model: "
                         f"{why_not_blocked}")
    if "hybrid" in modes and slots < 4:
        raise ValueError("mode 'hybrid' needs at least 4 task slots (D >= 2 x K >= 2), the "
                         f"cluster has {slots}")
    return list(modes)


def dense_layout(model: "Sequential", input_shape: Sequence[int] | None = None,
                 min_params: int = MIN_BLOCKED_PARAMS) -> tuple[DenseLayout | None, str]:
    """The :class:`DenseLayout` of an all-dense model (its layers with at least
    ``min_params`` parameters and an elementwise activation blocked), or ``None`` and why not."""
    from sparknet.cluster.model_parallel.block_partition import ELEMENTWISE
    from sparknet.layers.core import Dense

    shape = tuple(model.input_shape or input_shape or ())
    if not shape:
        return None, "its input shape is unknown"
    widths = [int(shape[-1])]
    for i, layer in enumerate(model.layers):
        if type(layer) is not Dense:
            return None, (f"layer {i} is {type(layer).__name__}; the cost model blocks all-dense "
                          "models only")
        widths.append(int(layer.units))
    last = len(model.layers) - 1
    acts = [getattr(layer, "activation", "identity") for layer in model.layers]
    blocked = tuple(i for i, act in enumerate(acts) if widths[i] * widths[i + 1] >= min_params
                    and (act in ELEMENTWISE or (i == last and act == "softmax")))
    if not blocked:
        return None, f"no dense layer has {min_params:,} parameters or more (the largest: " \
                     f"{max(a * b for a, b in zip(widths, widths[1:])):,})"
    return DenseLayout(tuple(widths), blocked), ""
