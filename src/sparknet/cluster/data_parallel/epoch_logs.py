"""A data-parallel fit's history: one entry per epoch of the round(s) just run."""
from __future__ import annotations

import logging
import math

import numpy as np

from sparknet.cluster.data_parallel.fit_context import FitContext, RoundLog
from sparknet.cluster.data_parallel.parameter_server import STATS

log = logging.getLogger("sparknet.cluster.data_parallel.trainer")


def record_epochs(ctx: FitContext, epoch: int, span: int, rl: RoundLog, train_time: float,
                  val_logs: dict[str, float],
                  lrs: list[float]) -> tuple[float, list[dict[str, float]]]:
    """One history entry per epoch of the round(s) just run (``lrs``: each one's rate);
    returns the last one's loss and the entries.
    The round's figures and training time are shared by its epochs; validation (run
    when the round ends) goes to the last, the others get ``NaN``."""
    rows = np.atleast_2d(rl.stats)
    if rows.shape[0] != span:  # a round with no rows anywhere: zeros for each epoch
        rows = np.broadcast_to(rows.sum(axis=0), (span, len(STATS)))
    shared = {  # the round's figures, the same for each of its epochs
        "rounds": rl.rounds / span,
        "local_steps": (rows[:, STATS.index("steps")].sum() /
                        max(rl.rounds * max(1, ctx.train.num_partitions), 1)),
        "spark_overhead": 1.0 - rl.compute / rl.wall if rl.wall > 0 else 0.0,
        **rl.logs}
    loss, entries = math.nan, []
    for i in range(span):
        last = i == span - 1
        st = dict(zip(STATS, rows[i]))
        w = max(st["weight_sum"], 1e-12)
        logs = {"loss": st["loss_sum"] / w}
        if ctx.spec.classification:
            logs["accuracy"] = st["correct"] / w
        if val_logs:
            logs.update(val_logs if last else dict.fromkeys(val_logs, math.nan))
        logs["time"] = train_time / span + (val_logs.get("val_time", 0.0) if last else 0.0)
        logs.update(shared)
        logs["lr"] = lrs[i]
        ctx.history.append(epoch + i, **logs)
        entries.append(logs)
        log.debug("epoch %d/%d: %s", epoch + i + 1, ctx.epochs,
                  ", ".join(f"{k}={v:.4g}" for k, v in logs.items()))
        if ctx.progress is not None:
            ctx.progress.epoch_end(epoch + i + 1, logs)
        loss = logs["loss"]
    return loss, entries
