"""History: saved and loaded as JSON (every field, NaN as null, bad files refused with a
clear error, never half-written), and drawn by History.plot / `python -m sparknet plot`."""
from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from sparknet import Dense, RMSprop, Sequential
from sparknet.history import History


def _digits_fit(digits, epochs=3):
    X, y, Xt, yt = digits
    model = Sequential([Dense(32, activation="relu"), Dense(10, activation="softmax")], seed=0)
    return model.fit(X, y, epochs=epochs, batch_size=32, validation_data=(Xt, yt), optimizer=RMSprop(lr=3e-3),
                     verbose=0)


def test_one_process_history_round_trips_through_json(tmp_path, digits):
    h = _digits_fit(digits)
    h.history["val_loss"][1] = math.nan  # as for an epoch inside a round of several epochs
    path = tmp_path / "h.json"
    h.save(path)
    doc = json.loads(path.read_text())
    assert doc["format"] == "sparknet-history" and doc["kind"] == "History" and doc["history"]["val_loss"][1] is None
    back = History.load(path)
    assert type(back) is History and back.epoch == h.epoch and set(back.history) == set(h.history)
    for k, v in h.history.items():
        np.testing.assert_array_equal(back[k], v)
    assert back["accuracy"][-1] > back["accuracy"][0]


@pytest.mark.parametrize("text,match", [
    ("{", "is not JSON"),
    ('{"format": "other"}', "not a sparknet history"),
    ('{"format": "sparknet-history", "version": 9, "epoch": [], "history": {}}', "version 9"),
    ('{"format": "sparknet-history", "version": 1, "epoch": [0, 1], "history": {"loss": [1.0]}}',
     "metric 'loss' must be a list of 2 numbers"),
    ('{"format": "sparknet-history", "version": 1, "epoch": [0], "history": {"loss": ["x"]}}',
     "metric 'loss' must be a list of 1 numbers"),
])
def test_bad_history_files_are_refused_naming_the_problem(tmp_path, text, match):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(ValueError, match=match):
        History.load(path)
    with pytest.raises(ValueError, match="cannot read the history"):
        History.load(tmp_path / "missing.json")


def test_a_failed_save_leaves_the_old_file(tmp_path, digits):
    h = _digits_fit(digits, epochs=1)
    path = tmp_path / "h.json"
    h.save(path)
    before = path.read_text()
    h.history["loss"][0] = object()  # not a number: to_json fails inside the atomic write
    with pytest.raises(TypeError):
        h.save(path)
    assert path.read_text() == before and sorted(p.name for p in tmp_path.iterdir()) == ["h.json"]


@pytest.mark.slow
def test_plot_draws_loss_and_accuracy_panels_and_the_cli_writes_a_png(tmp_path, digits):
    pytest.importorskip("matplotlib", reason="matplotlib not installed: History.plot needs it")
    h = _digits_fit(digits)
    fig = h.plot(tmp_path / "curves.png", title="digits")
    titles = [ax.get_title() for ax in fig.axes]
    assert titles == ["loss", "accuracy"]
    labels = [line.get_label() for line in fig.axes[0].get_lines()]
    assert labels == ["train loss", "val loss"]
    assert list(fig.axes[0].get_lines()[0].get_ydata()) == pytest.approx(h["loss"])
    assert (tmp_path / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    h.save(tmp_path / "h.json")
    out = subprocess.run([sys.executable, "-m", "sparknet", "plot", str(tmp_path / "h.json"), "-o",
                          str(tmp_path / "cli.png")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert (tmp_path / "cli.png").stat().st_size > 1000 and "3 epochs" in out.stdout
    bad = subprocess.run([sys.executable, "-m", "sparknet", "plot", str(tmp_path / "nothing.json")],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "cannot read the history" in bad.stderr and "Traceback" not in bad.stderr


@pytest.mark.slow
def test_async_fit_history_keeps_its_updates_and_plots_spark_share_and_staleness(tmp_path, spark, digits):
    pytest.importorskip("matplotlib", reason="matplotlib not installed: History.plot needs it")
    from sparknet.cluster import DataParallelTrainer
    from sparknet.cluster.data_parallel.fit_context import FitHistory

    X, y, Xt, yt = digits
    model = Sequential([Dense(32, activation="relu"), Dense(10, activation="softmax")], seed=0)
    trainer = DataParallelTrainer(model, spark, num_partitions=2, mode="async", local_steps=3,
                                  optimizer=RMSprop(lr=3e-3))
    _, h = trainer.fit(X, y, epochs=2, batch_size=32, validation_data=(Xt, yt), verbose=0)
    h.save(tmp_path / "async.json")
    back = History.load(tmp_path / "async.json")
    assert isinstance(back, FitHistory)
    assert back.setup_time == pytest.approx(h.setup_time) and len(back.updates) == len(h.updates) > 0
    assert [u["staleness"] for u in back.updates] == [u["staleness"] for u in h.updates]
    fig = back.plot(tmp_path / "async.png")
    titles = [ax.get_title() for ax in fig.axes]
    applied = sum(1 for u in h.updates if u["applied"])
    assert titles == ["loss", "accuracy", "Spark's share of each epoch (%)", f"staleness of {applied} applied deltas"]
    heights = [p.get_height() for p in fig.axes[3].patches]
    assert sum(heights) == applied
