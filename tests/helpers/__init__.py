"""Shared test machinery, imported as ``helpers`` (``pythonpath = ["tests"]`` in pyproject.toml).

- :mod:`helpers.models`: the small networks the tests train (one builder, each test's sizes at the call).
- :mod:`helpers.frames`: DataFrames of features and labels, in the column types Spark users bring.
- :mod:`helpers.gradcheck`: finite-difference gradient checks.
- :mod:`helpers.jobs`: waiting for Spark's status store to see jobs end.
- :mod:`helpers.standalone_cluster`, :mod:`helpers.connect_server`: a standalone cluster and a
  Spark Connect server on 127.0.0.1 (the conftest.py fixtures start them).
- :mod:`helpers.early_job`: a test's driver program started as its module starts, so that its
  Spark start overlaps the module's other tests.
- ``*_job.py``: driver programs the tests run as their own processes (``python <path> ARGS``),
  so that a driver can own a SparkContext on a standalone master, or be killed.  They import
  only the standard library at module level, so a test can also import one for its constants.
"""
