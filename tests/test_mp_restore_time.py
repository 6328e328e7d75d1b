"""After a model-parallel restore, an epoch's time on the console and in the history counts the
whole epoch: the steps before the loss, the restore and the replay, not the restart alone."""
from __future__ import annotations

import logging
import re
import time

import numpy as np

from sparknet import Dense, RMSprop
from sparknet.cluster.model_parallel import ModelParallel
from sparknet.cluster.model_parallel.block_partition import BlockPlan

PAUSE = 1.5  # seconds a step before the loss takes longer


def test_an_epoch_restored_mid_way_reports_its_whole_time(digits_xy, tmp_path, caplog, capsys):
    X, y = digits_xy
    X, y = X[:256], y[:256]   # 8 steps of 32 per epoch
    mp = ModelParallel([Dense(24, activation="relu"), Dense(10, activation="softmax")], BlockPlan({0: 2}),
                       (64,), dtype="float64", seed=0, optimizer=RMSprop(lr=2e-3),
                       checkpoint_dir=str(tmp_path / "ck"), name="restore-time")
    run, events = mp.backend.run, []

    def run_slow_then_losing(job, data=None):
        if mp.t == 2 and "slow" not in events:        # step 3 of epoch 1: slow, before the loss
            events.append("slow")
            time.sleep(PAUSE)
        if mp.t == 6 and "lost" not in events:        # step 7: the blocks' state vanishes
            events.append("lost")
            for store in mp.backend.stores:
                store.clear()
        return run(job, data)

    mp.backend.run = run_slow_then_losing
    try:
        with caplog.at_level(logging.WARNING, logger="sparknet.cluster.model_parallel"):
            hist = mp.fit(X, y, epochs=2, batch_size=32, checkpoint_every=5, verbose=2)
        out = capsys.readouterr().out
    finally:
        mp.close()
    assert events == ["slow", "lost"] and mp.restores == 1
    assert any("restored checkpoint" in r.getMessage() for r in caplog.records)
    assert len(hist["time"]) == 2 and np.isfinite(hist["time"]).all()
    assert hist["time"][0] >= PAUSE, hist["time"]          # the slow step before the restore counts
    shown = [float(m.group(1)) for m in re.finditer(r"^epoch 1/2 - (\d+\.\d+)s", out, re.M)]
    assert shown and shown[-1] >= PAUSE, out
    assert shown[-1] == round(hist["time"][0], 2) or abs(shown[-1] - hist["time"][0]) < 0.01
