"""Executors whose Python cannot import sparknet: the first fit says so in one error.

A session built by hand whose executors run a Python without sparknet (here: a wrapper
that hides it, as a virtual environment without sparknet would) must not fail with
``ModuleNotFoundError`` inside Java traces: :func:`sparknet.cluster.engine.workers.check_workers`
runs one task first and raises :class:`sparknet.errors.WorkerSetupError`."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import textwrap

import pytest

HIDE = textwrap.dedent('''
    import importlib.abc
    import sys

    class _Hide(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == "sparknet" or name.startswith("sparknet."):
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, _Hide())
''')

JOB = textwrap.dedent('''
    import numpy as np
    from pyspark.sql import SparkSession

    from sparknet import Dense, Sequential
    from sparknet.cluster import DataParallelTrainer
    from sparknet.errors import WorkerSetupError

    spark = SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false").getOrCreate()
    X = np.random.default_rng(0).random((64, 4)).astype(np.float32)
    y = (X[:, 0] > 0.5).astype(int)
    try:
        DataParallelTrainer(Sequential([Dense(2, activation="softmax")]), spark).fit(X, y, epochs=1, verbose=0)
        print("FITTED")
    except WorkerSetupError as exc:
        print("ERROR:", exc)
    spark.stop()
''')


@pytest.mark.slow
def test_executors_without_sparknet_get_one_clear_error(tmp_path):
    hide = tmp_path / "hide"
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(HIDE)
    wrapper = tmp_path / "python-without-sparknet"
    wrapper.write_text(f'#!/bin/sh\nPYTHONPATH="{hide}${{PYTHONPATH:+:$PYTHONPATH}}" exec {sys.executable} "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IEXEC)
    # the wrapper hides sparknet as intended
    probe = subprocess.run([str(wrapper), "-c", "import sparknet"], capture_output=True, text=True)
    assert "No module named 'sparknet'" in probe.stderr, probe.stderr
    env = dict(os.environ, PYSPARK_PYTHON=str(wrapper), OPENBLAS_NUM_THREADS="1")
    env.pop("PYSPARK_DRIVER_PYTHON", None)
    run = subprocess.run([sys.executable, "-c", JOB], capture_output=True, text=True, env=env,
                         timeout=300, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    assert "ERROR: the executors' Python cannot import 'sparknet'" in run.stdout, run.stdout + run.stderr[-3000:]
    assert "PYSPARK_PYTHON" in run.stdout and "spark.archives" in run.stdout and sys.executable in run.stdout
    assert "Traceback" not in run.stdout and "Py4JJavaError" not in run.stdout
