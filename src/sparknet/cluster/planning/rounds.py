"""How long a data-parallel round is: one pure rule, used by the trainer and the cost model.

A round of ``sync="average"`` runs ``tau`` local steps on every partition.  Given the
local steps of one epoch on the largest partition and ``tau``, :func:`size_rounds` says
how many rounds an epoch holds (or how many epochs one round spans, when ``tau`` is
longer than an epoch).  :meth:`FitContext
<sparknet.cluster.data_parallel.fit_context.FitContext>` sizes its rounds with it, and
:func:`sparknet.cluster.planning.cost.predict_sync_average` predicts with the same rule.

Where ``tau`` comes from (``DataParallelTrainer(local_steps=...)``):

* an int: that many steps;
* ``"auto"`` (default): :func:`choose_tau` on :func:`nominal_cost`, the round cost of a
  nominal machine computed from the network's flops, its parameter bytes and the batch
  size; no clock is read, so the same seed, data and settings size the same rounds in
  every process, and train the same weights;
* ``"timed"``: :func:`choose_tau` on costs measured in this process (a step timed on the
  driver, then the rounds run), re-sized between epochs: faster where the nominal machine
  is far from the real one, but the rounds (and so the weights) change from run to run.
  Between epochs, :func:`measured_cost` makes the cost model of the rounds run and
  :func:`resize_rounds` the next epoch's rounds from it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

#: ``local_steps`` values that let the trainer size the rounds itself.
SIZED = ("auto", "timed")

#: The least fixed cost of a round (seconds): the nominal machine's, and the floor of a
#: timed fit's first estimate.
MIN_FIXED_S = 0.08
#: Seconds per MiB of parameters sent out (broadcast) or brought back (task results),
#: added to :data:`MIN_FIXED_S`.
FIXED_S_PER_MIB = 0.01
#: The nominal machine's training rate (flops per second on one task's core): what
#: ``local_steps="auto"`` sizes rounds by, instead of a clock.
NOMINAL_FLOPS = 2.0e10
#: Seconds each layer adds to a nominal local step whatever its size (Python and call
#: overhead).
NOMINAL_LAYER_S = 3.0e-5

#: Rounds per epoch the sizing makes, the most first, each with the share of Spark's fixed
#: cost in a round allowed for it, in multiples of ``max_overhead`` (see :func:`choose_tau`).
#: Four rounds per epoch learn about as much per epoch as one process; a fit that drops
#: from 4 rounds to 2 loses up to 4 points of test accuracy in the epoch it does (MNIST
#: MLP, 2 partitions, seeds 0-2; ``benchmarks/README.md``, "A warm shard path, steady round
#: costs and four rounds per epoch"), so 4 are kept up to twice the share of the others.
ROUND_SHARES = ((4, 4.0), (2, 2.0), (1, 2.0))
#: A fit leaves the rounds per epoch it runs for fewer only when Spark's share of them is
#: past their allowance by this factor: measured shares swing by a tenth between epochs,
#: and a share at the limit moved fits from 4 rounds per epoch to 1 and kept them there
#: (``benchmarks/README.md``, "Rounds per epoch that stay put").
DROP_MARGIN = 1.25
#: Rounds whose fixed cost :func:`measured_cost` takes the median of.
FIXED_WINDOW = 16
#: A timed fit goes to more rounds per epoch than the first of :data:`ROUND_SHARES` only
#: when Spark's share of them is at most this fraction of the share allowed.
RAISE_MARGIN = 0.7


@dataclass
class RoundCostModel:
    """Round costs: measured (``local_steps="timed"``, the rounds run) or the nominal
    machine's (:func:`nominal_cost`).

    Attributes:
        t_fixed: seconds of a round that do not depend on its local steps.
        t_step: seconds of one local step (slowest partition).
        param_bytes: bytes of the flat parameter vector (sent out once, back once per task).
    """

    t_fixed: float
    t_step: float
    param_bytes: int = 0

    def round_time(self, steps: int) -> float:
        """Predicted seconds of a round of ``steps`` local steps."""
        return self.t_fixed + steps * self.t_step

    def overhead(self, steps: int) -> float:
        """Predicted fraction of a round spent on Spark's fixed cost."""
        return self.t_fixed / self.round_time(max(int(steps), 1))

    def steps_for(self, max_overhead: float = 0.1) -> int:
        """The fewest local steps per round keeping the fixed cost at most ``max_overhead``
        of the round.

        Raises:
            ValueError: ``max_overhead`` not in (0, 1).
        """
        if not 0.0 < max_overhead < 1.0:
            raise ValueError(f"max_overhead must be in (0, 1), got {max_overhead!r}")
        if self.t_step <= 0:
            return 1
        return max(1, math.ceil(self.t_fixed * (1.0 - max_overhead) / (max_overhead * self.t_step)))

    def epoch_time(self, steps_per_epoch: int, rounds: int) -> float:
        """Predicted seconds of an epoch of ``steps_per_epoch`` local steps cut into ``rounds``."""
        return rounds * self.t_fixed + steps_per_epoch * self.t_step


@dataclass(frozen=True)
class RoundSize:
    """The rounds of a fit.

    Attributes:
        rounds: rounds per epoch (1 for rounds of several epochs).
        epochs_per_round: epochs one round spans (1 unless ``tau`` is past an epoch).
        steps_per_round: local steps of the largest partition in one round.
    """

    rounds: int
    epochs_per_round: int
    steps_per_round: int


def size_rounds(steps_epoch: int, tau: int, *, sized: bool, multi_epoch: bool = True,
                max_epochs_per_round: int = 4) -> RoundSize:
    """Rounds for ``tau`` local steps per round over epochs of ``steps_epoch`` steps.

    Args:
        steps_epoch: local steps of one epoch on the largest partition.
        tau: local steps per round.
        sized: ``tau`` chosen by the sizing (:func:`choose_tau`): rounds per epoch are
            rounded down (no round shorter than ``tau``) and epochs per round up; a
            given ``tau`` rounds the other way (no round longer than asked).
        multi_epoch: whether a round may span several epochs (synchronous rounds; an
            asynchronous epoch is a budget of rows and has at least one round).
        max_epochs_per_round: the most epochs one round may span.

    Raises:
        ValueError: ``steps_epoch`` or ``tau`` below 1.
    """
    if steps_epoch < 1 or tau < 1:
        raise ValueError(f"steps_epoch and tau must be >= 1, got {steps_epoch!r} and {tau!r}")
    rounds, epochs = 1, 1
    if tau > steps_epoch and multi_epoch:
        span = math.ceil(tau / steps_epoch) if sized else tau // steps_epoch
        epochs = max(1, min(int(max_epochs_per_round), span))
    else:
        rounds = max(1, steps_epoch // tau if sized else math.ceil(steps_epoch / tau))
    return RoundSize(rounds, epochs, math.ceil(steps_epoch / rounds) * epochs)


def choose_tau(cost: RoundCostModel, steps_epoch: int, max_overhead: float,
               current: int) -> tuple[int, float]:
    """Local steps per round and the share of Spark's fixed cost allowed: the fewest steps
    keeping the share at most ``max_overhead``, cut to 4 rounds per epoch when that keeps it
    at most 4 times that, else to 2 or 1 within twice (:data:`ROUND_SHARES`; long rounds
    average the partitions' models too rarely to learn as much per epoch as one process,
    and rounds of several epochs validate only every few epochs: ``benchmarks/README.md``,
    "Rounds per epoch").  The ``current`` rounds per epoch keep their place up to
    :data:`DROP_MARGIN` times their share."""
    tau = cost.steps_for(max_overhead)
    for rounds, times in ROUND_SHARES:
        short, share = max(1, steps_epoch // rounds), times * max_overhead
        allowed = share * (DROP_MARGIN if rounds == current else 1.0)
        if tau > short and cost.overhead(short) <= allowed:
            return short, share
    return tau, max_overhead


def measured_cost(fixed: Sequence[float], compute: float, steps: int,
                  param_bytes: int = 0) -> RoundCostModel:
    """The round cost measured from the rounds run: Spark's fixed cost per round is the
    session's, not the epoch's, so ``t_fixed`` is the median of the last
    :data:`FIXED_WINDOW` rounds' fixed costs in ``fixed`` (the fit's rounds, oldest first;
    each round's wall seconds less its slowest task's compute): one slow round (a fit's
    first, a GC pause) does not re-size the rounds (it swung 0.08-0.25 s between the
    rounds of one fit).  ``t_step`` is ``compute`` seconds over ``steps`` local steps.

    Raises:
        ValueError: ``fixed`` empty, or ``steps`` below 1.
    """
    if not len(fixed) or steps < 1:
        raise ValueError(f"need the fixed cost of a round and steps >= 1, got {list(fixed)!r} "
                         f"and {steps!r}")
    t_fixed = float(np.median(list(fixed)[-FIXED_WINDOW:]))
    return RoundCostModel(max(t_fixed, 1e-4), compute / steps, int(param_bytes))


def resize_rounds(cost: RoundCostModel, steps_epoch: int, current: RoundSize,
                  max_overhead: float, *, multi_epoch: bool = True,
                  max_epochs_per_round: int = 4) -> RoundSize:
    """The rounds of a timed fit's next epoch, from the round cost measured: the ``tau`` of
    :func:`choose_tau` (the ``current`` rounds per epoch keeping their place up to
    :data:`DROP_MARGIN` times their share) sized by :func:`size_rounds`.  Shorter rounds
    than ``current``'s, more than the first of :data:`ROUND_SHARES` per epoch, only when
    Spark's share of them is at most :data:`RAISE_MARGIN` of the share allowed: no
    flip-flopping on noise; rounds of several epochs are cut as soon as the measured cost
    allows (they average the partitions too rarely and validate only every few epochs).

    Args:
        cost: the measured round cost (:func:`measured_cost`).
        steps_epoch: local steps of one epoch on the largest partition.
        current: the rounds run so far.
        max_overhead: the share of Spark's fixed cost in a round aimed at.
        multi_epoch: whether a round may span several epochs (see :func:`size_rounds`).
        max_epochs_per_round: the most epochs one round may span.
    """
    held = current.rounds if current.epochs_per_round == 1 else 0
    tau, share = choose_tau(cost, steps_epoch, max_overhead, held)
    size = size_rounds(steps_epoch, tau, sized=True, multi_epoch=multi_epoch,
                       max_epochs_per_round=max_epochs_per_round)
    if (size.steps_per_round < current.steps_per_round and current.epochs_per_round <= 1
            and size.rounds > ROUND_SHARES[0][0]
            and cost.overhead(size.steps_per_round) > RAISE_MARGIN * share):
        return current
    return size


def nominal_cost(flops_per_sample: float, layers: int, param_bytes: int,
                 batch_size: int) -> RoundCostModel:
    """The round cost of the nominal machine for a network of ``layers`` layers whose training
    takes ``flops_per_sample`` flops per sample
    (:func:`sparknet.cluster.planning.probes.network_shape`) and whose parameters take
    ``param_bytes``, at ``batch_size`` rows per local step: the step's flops at
    :data:`NOMINAL_FLOPS` plus :data:`NOMINAL_LAYER_S` per layer, and :data:`MIN_FIXED_S` plus
    the parameters out and back at :data:`FIXED_S_PER_MIB` per MiB.  No clock is read."""
    t_step = (float(flops_per_sample) * int(batch_size) / NOMINAL_FLOPS
              + NOMINAL_LAYER_S * max(int(layers), 1))
    mib = int(param_bytes) / 2 ** 20
    return RoundCostModel(MIN_FIXED_S + 2 * mib * FIXED_S_PER_MIB, t_step, int(param_bytes))
