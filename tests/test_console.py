"""What a fit writes to the console, Keras's convention: verbose=0 nothing, 1 one live bar
(left on screen, the history's metric names) with a line kept per epoch, 2 the lines alone;
Spark's share in words, validation every k epochs said once and no NaN shown; the demo says
what it does before its first epoch, has one result line, no log lines through the bar and
none of Spark's own progress or warnings."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from helpers.models import mlp
from sparknet import RMSprop

LINE = re.compile(r"^epoch (\d+)/(\d+) - \d+\.\d\ds - loss: \d\.\d{4} - accuracy: \d\.\d{4}"
                  r"( - val_loss: \d+\.\d{4} - val_accuracy: \d\.\d{4})?( - spark: \d+% of round time)?$")


def test_one_process_verbose_levels(capsys, digits):
    X, y, Xt, yt = digits
    mlp(16).fit(X, y, epochs=3, batch_size=64, validation_data=(Xt, yt), verbose=0)
    out, err = capsys.readouterr()
    assert out == "" and err == ""
    mlp(16).fit(X, y, epochs=3, batch_size=64, validation_data=(Xt, yt), verbose=2)
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert [LINE.match(ln).group(1) for ln in lines] == ["1", "2", "3"], out
    assert all("val_accuracy" in ln for ln in lines) and err == ""
    mlp(16).fit(X, y, epochs=3, batch_size=64, validation_data=(Xt, yt), verbose=1)
    out, err = capsys.readouterr()
    assert out == ""
    screen = err.replace("\r", "\n").splitlines()
    kept = [m.group(1) for m in map(LINE.match, (ln.strip() for ln in screen)) if m]
    assert kept == ["1", "2", "3"], err  # Keras's verbose=1: a line per epoch stays on screen
    final = screen[-1]
    assert final.startswith("epoch 3/3") and "100%" not in final and "loss=" in final
    assert "val_accuracy=" in final and "train_" not in err and "nan" not in err.lower()
    with pytest.raises(ValueError, match="verbose must be 0 .* got 3"):
        mlp(16).fit(X, y, epochs=1, verbose=3)


@pytest.mark.slow
def test_data_parallel_verbose_two_prints_one_line_per_epoch(capsys, spark, digits):
    from sparknet.cluster import DataParallelTrainer

    X, y, Xt, yt = digits
    trainer = DataParallelTrainer(mlp(16), spark, num_partitions=2, local_steps=8,
                                  optimizer=RMSprop(lr=3e-3))
    trainer.fit(X, y, epochs=3, batch_size=32, validation_data=(Xt, yt), verbose=2)
    out, _ = capsys.readouterr()
    lines = [ln for ln in out.splitlines() if ln.startswith("epoch ")]
    assert [LINE.match(ln).group(1) for ln in lines] == ["1", "2", "3"], out
    assert all(LINE.match(ln).group(4) for ln in lines)  # Spark's share of each epoch is shown
    trainer.fit(X, y, epochs=2, batch_size=32, verbose=0)
    out, err = capsys.readouterr()
    assert "epoch" not in out and "epoch" not in err


@pytest.mark.slow
def test_demo_output_has_one_bar_one_result_and_no_noise(tmp_path):
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, OPENBLAS_NUM_THREADS="1")
    run = subprocess.run([sys.executable, "-m", "sparknet", "demo"], capture_output=True, text=True,
                         timeout=600, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert re.fullmatch(r"digits MLP \(local Spark\): test accuracy 0\.9\d{3} in \d+\.\d s\n", run.stdout), run.stdout
    err = run.stderr.replace("\r", "\n")
    bar = [ln for ln in err.splitlines() if re.match(r"^epochs? \d", ln)]
    assert bar, err[-2000:]
    assert re.search(r"\|█{20}\| \[.*loss=.*accuracy=.*val_loss=.*val_accuracy=0\.9\d+", bar[-1]), bar[-1]
    # before the first epoch: what it is doing (Spark starting, the data loading), not silence
    first = err.replace("\r", "\n").splitlines()
    assert any(ln.startswith("sparknet demo: loading scikit-learn's digits") for ln in first), err[:2000]
    assert any(ln.startswith("sparknet: loading the data onto the executors") for ln in first), err[:2000]
    assert "spark: " in err and "% of round time" in err and "nan" not in err.lower()
    # Spark's log4j banner (printed twice by a default profile) and Hadoop's native-library note
    for noise in ("log4j", "Setting default log level", "NativeCodeLoader"):
        assert noise not in err, f"{noise!r} in the demo's console:\n{err[:2000]}"
    # no bar drawn before the first round: the first bar line already names its epoch
    assert not re.search(r"^ *\|\s*\| \[", err, re.M), err[:2000]
    for noise in ("[Stage", "WARN PythonRDD", "locally checkpointed", " INFO ", "sparknet.cluster"):
        assert noise not in err, f"{noise!r} in the demo's console:\n{err[-2000:]}"
    assert not re.search(r"epoch \d+/\d+: loss=", err), err[-2000:]  # the trainer's debug log lines


def test_validation_every_k_epochs_is_said_once_and_no_nan_shown(capsys, spark, digits):
    """Rounds of two epochs (local_steps twice an epoch's): validation runs when a round
    ends; the console says so once, and the epochs in between show no val_* at all."""
    from sparknet.cluster import DataParallelTrainer

    X, y, Xt, yt = digits
    steps_per_epoch = -(-(len(y) // 2) // 32)  # per partition
    trainer = DataParallelTrainer(mlp(16), spark, num_partitions=2, local_steps=2 * steps_per_epoch,
                                  optimizer=RMSprop(lr=3e-3))
    trainer.fit(X, y, epochs=4, batch_size=32, validation_data=(Xt, yt), verbose=2)
    out, err = capsys.readouterr()
    assert out.count("validation every 2 epochs") == 1, out
    lines = [ln for ln in out.splitlines() if ln.startswith("epoch ")]
    assert [("val_loss" in ln) for ln in lines] == [False, True, False, True], out
    assert "nan" not in out.lower() and "nan" not in err.lower()
    assert err.startswith("sparknet: loading the data onto the executors"), err
