"""The planner's result: candidates ranked by predicted time per epoch (:func:`rank`), the
:class:`Plan` that holds them with those ruled out, and its explanation of the choice.

Candidates within :data:`TOLERANCE` of the fastest count as equally fast; among them the one
that synchronises most often is preferred (fewest local steps, then fewest partitions or blocks),
because more averaging converges in fewer epochs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Sequence

from sparknet.cluster.planning.memory import DATA_PARALLEL

if TYPE_CHECKING:
    from sparknet.cluster.planning.cost import NetworkCosts, Prediction, SparkCosts

#: candidates predicted within this share of the fastest count as equally fast
TOLERANCE = 0.05


@dataclass
class RuledOut:
    """A candidate set aside, and why (its memory per executor)."""
    prediction: "Prediction"
    reason: str


@dataclass
class Plan:
    """Ranked candidates (:attr:`candidates`, :attr:`best` first, then by predicted time per
    epoch), those that do not fit an executor's memory (:attr:`ruled_out`, with the
    reason), the rows per epoch, and the costs and memory the predictions used."""

    candidates: list["Prediction"]
    ruled_out: list[RuledOut]
    samples: int
    spark_costs: "SparkCosts"
    net_costs: "NetworkCosts"
    memory_per_executor: float | None = None

    @property
    def best(self) -> "Prediction":
        """The chosen candidate."""
        return self.candidates[0]

    @property
    def runner_up(self) -> "Prediction | None":
        """The fastest candidate of another configuration than the best (another mode, or
        other partitions, blocks or replicas), or ``None`` when there is none."""
        key = config_key(self.best)
        return next((p for p in self.candidates[1:] if config_key(p) != key), None)

    def trainer_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for the trainer of the best candidate:
        :class:`~sparknet.cluster.data_parallel.trainer.DataParallelTrainer` (``num_partitions``,
        ``mode``, ``sync``, ``local_steps``) or
        :class:`~sparknet.cluster.model_parallel.ModelParallel` (``plan``, ``replicas``)."""
        b, s = self.best, self.best.settings
        if b.mode in DATA_PARALLEL:
            kw: dict[str, Any] = {"num_partitions": s["partitions"],
                                  "mode": "async" if b.mode == "async" else "sync"}
            if b.mode != "async":
                kw["sync"] = b.mode
            if "tau" in s:
                kw["local_steps"] = s["tau"]
            return kw
        return {"plan": s["plan"], "replicas": s.get("D", 1)}

    def __repr__(self) -> str:
        """A few lines: the best candidate and the runner-up; :meth:`explain` gives their
        breakdowns, :meth:`table` every candidate."""
        ru = self.runner_up
        counts = f"{len(self.candidates)} candidates" + (f", {len(self.ruled_out)} ruled out"
                                                         if self.ruled_out else "")
        return "\n".join([f"Plan({self.samples:,} samples per epoch, {counts};",
                          f"  best:      {describe(self.best)}",
                          f"  runner-up: {'none' if ru is None else describe(ru)};",
                          "  .explain(): why, .table(): every candidate, .trainer_kwargs(): the "
                          "settings)"])

    def __str__(self) -> str:
        return self.explain()

    def table(self) -> str:
        """Every candidate, one line each, best first, then those ruled out with the reason."""
        lines = [f"{i + 1:>4}. {describe(p)}" for i, p in enumerate(self.candidates)]
        lines += [f"   -. {describe(r.prediction)}: ruled out, {r.reason}" for r in self.ruled_out]
        return "\n".join(lines)

    def explain(self) -> str:
        """The best candidate and the runner-up, their breakdowns, and why the best wins."""
        sc = self.spark_costs
        lines = [f"plan for {self.samples:,} samples per epoch, batch {self.net_costs.batch_size} "
                 f"({sc.hosts} host(s) x {sc.cores_per_host} cores, "
                 f"{sc.bandwidth_bytes_s * 8 / 1e9:.3g} Gb/s); {len(self.candidates)} candidates"
                 + (f", {len(self.ruled_out)} ruled out" if self.ruled_out else "")]
        lines.append("best:      " + describe(self.best))
        lines += _breakdown_lines(self.best)
        ru = self.runner_up
        if ru is None:
            lines.append("runner-up: none (a single configuration applies)")
        else:
            lines.append("runner-up: " + describe(ru))
            lines += _breakdown_lines(ru)
            lines.append("why: " + _why(self.best, ru))
        near = sum(1 for p in self.candidates[1:] if config_key(p) == config_key(self.best)
                   and p.epoch_s <= self.candidates[0].epoch_s * (1 + TOLERANCE))
        if near and self.best.mode in ("average", "async"):
            lines.append(f"     ({near} with more local steps are within {100 * TOLERANCE:.0f}%: "
                         "fewer is taken)")
        per_mode: dict[str, "Prediction"] = {}
        for c in self.candidates:
            per_mode.setdefault(c.mode, c)
        if len(per_mode) > 1:
            lines.append("best per mode: " + "; ".join(f"{m} {c.epoch_s:.3g} s"
                                                       for m, c in per_mode.items()))
        lines += [f"ruled out: {describe(r.prediction)}: {r.reason}" for r in self.ruled_out[:3]]
        lines += [f"ruled out: {len(self.ruled_out) - 3} more"] if len(self.ruled_out) > 3 else []
        return "\n".join(lines)


def describe(p: "Prediction") -> str:
    """One line: mode, settings, predicted seconds per epoch and speedup."""
    s = p.settings
    if p.mode in DATA_PARALLEL:
        what = f"{s['partitions']} partition(s)" + (f", tau={s['tau']}" if "tau" in s else "")
    else:
        what = f"K={s['K']}" + (" paired" if s.get("paired")
                                else "") + (f", D={s['D']}" if s.get("D", 1) > 1 else "")
    what += f", {s.get('threads', 1)} thread(s)/task"
    return (f"{p.mode} ({what}): {p.epoch_s:.4g} s/epoch, {p.speedup:.2f}x one process "
            f"({p.one_process_epoch_s:.4g} s)")


def _breakdown_lines(p: "Prediction") -> list[str]:
    total = sum(v for v in p.breakdown.values() if v > 0) or 1.0
    parts = sorted(((k, v) for k, v in p.breakdown.items() if v > 0), key=lambda kv: -kv[1])
    return ["           " + ", ".join(f"{k} {v:.3g} s ({100 * v / total:.0f}%)" for k, v in parts)]


def _why(best: "Prediction", other: "Prediction") -> str:
    """The terms of the breakdown that separate two candidates, largest first."""
    gap = other.epoch_s - best.epoch_s
    keys = set(best.breakdown) | set(other.breakdown)
    diff = sorted(((k, other.breakdown.get(k, 0.0) - best.breakdown.get(k, 0.0)) for k in keys),
                  key=lambda kv: -abs(kv[1]))
    terms = ", ".join(f"{k} {d:+.3g} s" for k, d in diff[:3] if abs(d) > 1e-9)
    if gap <= best.epoch_s * TOLERANCE:
        return (f"the runner-up is within {100 * TOLERANCE:.0f}% ({gap:+.3g} s/epoch: {terms}); "
                f"the best synchronises more often or uses fewer tasks")
    return (f"the runner-up needs {gap:.3g} s more per epoch ({100 * gap / best.epoch_s:.0f}%): "
            f"{terms}")


def config_key(p: "Prediction") -> tuple:
    """What makes a candidate's configuration: mode, partitions, blocks, replicas, pairing
    and threads (local steps aside)."""
    s = p.settings
    return (p.mode, s.get("partitions"), s.get("K"), s.get("D"), s.get("paired"), s.get("threads"))


def _preference(p: "Prediction") -> tuple:
    """Among equally fast candidates: fewest local steps, then fewest tasks."""
    s = p.settings
    tasks = s.get("partitions") or s.get("K", 1) * s.get("D", 1)
    return (s.get("tau", 0), tasks, s.get("threads", 1))


def rank(predictions: Sequence["Prediction"]) -> list["Prediction"]:
    """``predictions`` best first: the preferred one among those within :data:`TOLERANCE`
    of the fastest (:func:`_preference`), then the rest by predicted time per epoch."""
    if not predictions:
        return []
    ordered = sorted(predictions, key=lambda p: p.epoch_s)
    limit = ordered[0].epoch_s * (1 + TOLERANCE)
    best = min((p for p in ordered if p.epoch_s <= limit), key=_preference)
    return [best] + [p for p in ordered if p is not best]
