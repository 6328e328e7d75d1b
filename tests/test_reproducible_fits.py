"""The same seed, data and settings train the same weights by default, in separate processes:
``local_steps="auto"`` sizes the rounds by one pure rule (``sparknet.cluster.planning.rounds``)
from the network and the data, never from a clock.  The start-up line states the rounds the
fit runs, in plain grammar."""
from __future__ import annotations

import json
import logging
import math
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from sparknet import Dense, RMSprop, Sequential
from sparknet.cluster.data_parallel.trainer import DataParallelTrainer
from sparknet.cluster.planning.probes import network_shape
from sparknet.cluster.planning.rounds import nominal_cost, size_rounds

HERE = os.path.dirname(os.path.abspath(__file__))

# One fit in a fresh process (local[2]); with "busy", a driver thread burns CPU throughout, so
# that anything timed on the driver (a step timed to size the rounds) comes out slower.
FIT = r"""
import hashlib, json, sys, threading
import numpy as np
from sparknet import Dense, RMSprop, Sequential
from sparknet.cluster.data_parallel.trainer import DataParallelTrainer
from sparknet.cluster.engine.session import get_spark

stop = threading.Event()
def burn():
    while not stop.is_set():
        sum(range(2000))
if sys.argv[1] == "busy":
    threading.Thread(target=burn, daemon=True).start()
rng = np.random.default_rng(7)
X = rng.standard_normal((6000, 32)).astype(np.float32)
y = (X[:, :10].argmax(axis=1)).astype(np.int64)
spark = get_spark("local[2]", app_name="sparknet-reproducible", warm_up=False,
                  conf={"spark.ui.enabled": "false"})
spark.sparkContext.setLogLevel("ERROR")
model = Sequential([Dense(32, activation="relu"), Dense(10, activation="softmax")], seed=3)
trainer = DataParallelTrainer(model, spark, num_partitions=2, optimizer=RMSprop(lr=2e-3))
_, h = trainer.fit(X, y, epochs=3, batch_size=16, verbose=0)
stop.set()
print("RESULT " + json.dumps({"sha": hashlib.sha256(model.params.tobytes()).hexdigest(),
                              "rounds": h["rounds"], "local_steps": h["local_steps"],
                              "loss": h["loss"]}), flush=True)
spark.stop()
"""


def _fits_in_two_processes(*hows: str) -> list[dict]:
    """One fit per ``how``, each in its own fresh process, the processes run at once (they
    contend for the same cores: anything sized from a clock would come out differently)."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "PYSPARK_PYTHON": sys.executable}
    procs = [subprocess.Popen([sys.executable, "-c", FIT, how], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for how in hows]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=600)
        got = [ln for ln in out.splitlines() if ln.startswith("RESULT ")]
        assert proc.returncode == 0 and got, err[-3000:]
        results.append(json.loads(got[-1][len("RESULT "):]))
    return results


@pytest.mark.slow
def test_the_same_seed_trains_bit_identical_weights_in_two_processes():
    first, second = _fits_in_two_processes("quiet", "busy")
    print(f"rounds per epoch {first['rounds']} and {second['rounds']}; "
          f"losses {first['loss']} and {second['loss']}")
    assert first["rounds"] == second["rounds"] and first["local_steps"] == second["local_steps"]
    assert first["loss"] == second["loss"]
    assert first["sha"] == second["sha"]


def test_auto_sizing_is_a_function_of_the_network_and_the_data_alone():
    """The nominal round cost comes from flops and parameter bytes: the same model built twice
    gives the same cost, a wider one a dearer step, and the sizing rule is pure."""
    def cost(width: int, batch: int):
        m = Sequential([Dense(width, activation="relu"), Dense(10, activation="softmax")], seed=0)
        m.build((64,))
        return nominal_cost(network_shape(m)[0], len(m.layers), m.params.nbytes, batch)

    assert cost(32, 32) == cost(32, 32)
    assert cost(256, 32).t_step > cost(32, 32).t_step
    assert cost(256, 32).t_fixed > cost(32, 32).t_fixed
    assert cost(32, 64).t_step > cost(32, 32).t_step
    # sized tau: whole rounds per epoch rounded down, epochs per round rounded up
    assert size_rounds(100, 30, sized=True) == size_rounds(100, 30, sized=True)
    sized, given = size_rounds(100, 30, sized=True), size_rounds(100, 30, sized=False)
    assert (sized.rounds, given.rounds) == (3, 4)
    assert size_rounds(10, 25, sized=True).epochs_per_round == 3
    assert size_rounds(10, 25, sized=False).epochs_per_round == 2
    assert size_rounds(10, 25, sized=True, multi_epoch=False).rounds == 1
    assert size_rounds(10, 500, sized=True, max_epochs_per_round=4).steps_per_round == 40
    with pytest.raises(ValueError, match="tau must be >= 1"):
        size_rounds(10, 0, sized=True)


def test_local_steps_takes_auto_timed_or_a_count(spark):
    model = Sequential([Dense(8, activation="relu"), Dense(10, activation="softmax")], seed=0)
    for ok in ("auto", "timed", 5):
        DataParallelTrainer(model, spark, local_steps=ok)
    with pytest.raises(ValueError, match="local_steps.*'auto' or 'timed'"):
        DataParallelTrainer(model, spark, local_steps="fast")


def _startup_line(caplog) -> str:
    lines = [r.getMessage() for r in caplog.records if " rows in " in r.getMessage()]
    assert len(lines) == 1, [r.getMessage() for r in caplog.records]
    return lines[0]


@pytest.mark.slow
def test_the_startup_line_states_the_rounds_the_fit_runs(spark, digits, caplog):
    X, y, _, _ = digits
    caplog.set_level(logging.INFO, logger="sparknet.cluster.data_parallel.trainer")

    def fit(**kw):
        caplog.clear()
        model = Sequential([Dense(16, activation="relu"), Dense(10, activation="softmax")], seed=0)
        fit_kw = {"epochs": kw.pop("epochs"), "batch_size": 32, "verbose": 0}
        _, h = DataParallelTrainer(model, spark, num_partitions=2, optimizer=RMSprop(lr=2e-3),
                                   **kw).fit(X, y, **fit_kw)
        return _startup_line(caplog), h

    steps_epoch = math.ceil(math.ceil(len(y) / 2) / 32)
    # a given tau: several rounds per epoch, as many as the history counts
    line, h = fit(local_steps=5, epochs=1)
    rounds = math.ceil(steps_epoch / 5)
    tau = math.ceil(steps_epoch / rounds)
    assert f"rounds of ~{tau} local steps of 32 rows, {rounds} rounds per epoch" in line, line
    assert h["rounds"] == [rounds]
    # a round as long as an epoch: "1 round per epoch", never "1 rounds/epoch"
    line, h = fit(local_steps=steps_epoch, epochs=1)
    assert f"rounds of ~{steps_epoch} local steps of 32 rows, 1 round per epoch" in line, line
    assert "rounds/epoch" not in line and h["rounds"] == [1]
    # rounds of 4 epochs asked for, a fit of 2: its one round spans the 2 epochs it runs
    line, h = fit(local_steps=4 * steps_epoch, epochs=2)
    want = f"rounds of 2 epochs (~{2 * steps_epoch} local steps of 32 rows), 1 round per 2 epochs"
    assert want in line, line
    assert h["rounds"] == [0.5, 0.5]
    # the default sizing says what it sized, and the history runs it
    line, h = fit(epochs=3)
    m = re.search(r"rounds of (\d+) epochs|(\d+) rounds? per epoch", line)
    assert m is not None and "local_steps='auto'" in line, line
    per_epoch = 1 / int(m.group(1)) if m.group(1) else int(m.group(2))
    assert all(r == pytest.approx(per_epoch) for r in h["rounds"]), (line, h["rounds"])
    assert np.isfinite(h["loss"]).all()
