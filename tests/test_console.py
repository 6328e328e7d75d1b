"""What a fit writes to the console, Keras's convention: verbose=0 nothing, 1 one live bar
(left on screen, labelled train/val figures), 2 one line per epoch; the demo's output has
one result line, no log lines through the bar and none of Spark's own progress or warnings."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from sparknet import Dense, RMSprop, Sequential

LINE = re.compile(r"^epoch (\d+)/(\d+) - \d+\.\d\ds - train_loss \d\.\d{4} - train_acc \d\.\d{4}"
                  r"( - val_loss \d+\.\d{4} - val_acc \d\.\d{4})?( - spark \d+%)?$")


def _mlp():
    return Sequential([Dense(16, activation="relu"), Dense(10, activation="softmax")], seed=0)


def test_one_process_verbose_levels(capsys, digits):
    X, y, Xt, yt = digits
    _mlp().fit(X, y, epochs=3, batch_size=64, validation_data=(Xt, yt), verbose=0)
    out, err = capsys.readouterr()
    assert out == "" and err == ""
    _mlp().fit(X, y, epochs=3, batch_size=64, validation_data=(Xt, yt), verbose=2)
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert [LINE.match(ln).group(1) for ln in lines] == ["1", "2", "3"], out
    assert all("val_acc" in ln for ln in lines) and err == ""
    _mlp().fit(X, y, epochs=3, batch_size=64, validation_data=(Xt, yt), verbose=1)
    out, err = capsys.readouterr()
    assert out == ""
    final = err.replace("\r", "\n").strip().splitlines()[-1]
    assert final.startswith("epoch 3/3") and "100%" not in final and "train_loss=" in final and "val_acc=" in final
    with pytest.raises(ValueError, match="verbose must be 0 .* got 3"):
        _mlp().fit(X, y, epochs=1, verbose=3)


def test_data_parallel_verbose_two_prints_one_line_per_epoch(capsys, spark, digits):
    from sparknet.cluster import DataParallelTrainer

    X, y, Xt, yt = digits
    trainer = DataParallelTrainer(_mlp(), spark, num_partitions=2, local_steps=8, optimizer=RMSprop(lr=3e-3))
    trainer.fit(X, y, epochs=3, batch_size=32, validation_data=(Xt, yt), verbose=2)
    out, _ = capsys.readouterr()
    lines = [ln for ln in out.splitlines() if ln.startswith("epoch ")]
    assert [LINE.match(ln).group(1) for ln in lines] == ["1", "2", "3"], out
    assert all(LINE.match(ln).group(4) for ln in lines)  # Spark's share of each epoch is shown
    trainer.fit(X, y, epochs=2, batch_size=32, verbose=0)
    out, err = capsys.readouterr()
    assert "epoch" not in out and "epoch" not in err


def test_demo_output_has_one_bar_one_result_and_no_noise(tmp_path):
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, OPENBLAS_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-m", "sparknet", "demo"], capture_output=True, text=True,
                         timeout=600, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert re.fullmatch(r"digits MLP \(local Spark\): test accuracy 0\.9\d{3} in \d+\.\d s\n", run.stdout), run.stdout
    err = run.stderr.replace("\r", "\n")
    bar = [ln for ln in err.splitlines() if re.match(r"^epochs? \d", ln)]
    assert bar, err[-2000:]
    assert re.search(r"\|█{20}\| \[.*train_loss=.*train_acc=.*val_loss=.*val_acc=0\.9\d+", bar[-1]), bar[-1]
    for noise in ("[Stage", "WARN PythonRDD", "locally checkpointed", " INFO ", "sparknet.cluster", "accuracy=1"):
        assert noise not in err, f"{noise!r} in the demo's console:\n{err[-2000:]}"
