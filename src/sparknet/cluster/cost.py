"""A measured cost model of one synchronous round, used to size rounds.

The paper's formula for ``K`` rounds is ``T = K [T_lat + N T_data]``.  For a
data-parallel round of ``tau`` local steps on every partition (in parallel):

    T_round(tau) = T_fixed + tau * T_step

``T_fixed`` is everything that does not shrink with more local work -- job launch,
broadcasting the flat parameters, bringing one parameter-sized vector back per task,
the driver's update -- and ``T_step`` the compute of one local minibatch step in the
slowest task.  Both are measured on the live cluster by a probe round
(:meth:`sparknet.cluster.data_parallel.DataParallelTrainer` does it at the start of
every fit).  Spark's share of a round is ``T_fixed / T_round``; keeping it at most
``f`` needs ``tau >= T_fixed (1 - f) / (f T_step)``.
"""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class RoundCostModel:
    """Measured round costs.

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
