"""Shared fixtures: a local Spark session (one per test run), data paths, and PyTorch and
Keras for the interop tests (skipped, saying why, where they are not installed)."""
from __future__ import annotations

import os
import sys

import pytest

from helpers import docs_build, quick_jvm
from helpers.early_job import discard, has_java, in_background

# Spark's Python workers must run this interpreter (where sparknet is installed).
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

HERE = os.path.dirname(os.path.abspath(__file__))
SHARED_DATA = os.path.abspath(os.path.join(HERE, "..", "..", "shared", "data"))
MNIST_DIR = os.environ.get("SPARKNET_MNIST", os.path.join(SHARED_DATA, "mnist"))
SHAKESPEARE = os.environ.get("SPARKNET_SHAKESPEARE", os.path.join(SHARED_DATA, "shakespeare.txt"))

# Every JVM the run starts from here on starts quicker (C1 only, a shared class archive);
# the archive's first dump on this machine runs beside the first tests.
_CLASS_DUMP = {"future": quick_jvm.install()}


@pytest.fixture(scope="session")
def spark():
    """A local[2] SparkSession shared by every test that needs Spark."""
    from pyspark.sql import SparkSession

    session = (
        SparkSession.builder.master("local[2]")
        .appName("sparknet-tests")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.driver.memory", "2g")
        .config("spark.python.worker.reuse", "true")
        .config("spark.python.unix.domain.socket.enabled", "true")
        .config("spark.sql.execution.arrow.pyspark.enabled", "true")
        .getOrCreate()
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


def _new_cluster():
    from helpers.standalone_cluster import StandaloneCluster

    return StandaloneCluster(workers=2, cores=1, memory="3g")


# The standalone cluster's start (three JVMs, ~25 s) overlaps the test module run just before
# the first test that needs it: the first test of that module starts it in the background.
_EARLY: dict = {}


def pytest_collection_modifyitems(session, config, items):
    docs_build.start_early([it.nodeid for it in items])
    first = next((i for i, it in enumerate(items) if "_standalone" in getattr(it, "fixturenames", ())), 0)
    if first > 0:
        j = first - 1
        while j > 0 and items[j - 1].path == items[first - 1].path:
            j -= 1
        _EARLY["trigger"] = items[j].nodeid


def pytest_report_header(config):
    flags = os.environ.get("SPARKNET_TEST_JAVA_OPTIONS")
    dumping = " (dumping the class archive in the background)" if _CLASS_DUMP["future"] else ""
    return f"Spark JVMs: {flags}{dumping}" if flags else "Spark JVMs: default flags"


def pytest_runtest_setup(item):
    _CLASS_DUMP["future"] = quick_jvm.adopt(_CLASS_DUMP["future"])
    if item.nodeid == _EARLY.get("trigger") and "future" not in _EARLY and has_java():
        _EARLY["future"] = in_background(lambda: _new_cluster().__enter__(), "standalone-start")


def pytest_sessionfinish(session, exitstatus):
    discard(_EARLY.pop("future", None), "stop")  # started early, never used: stopped here
    docs_build.stop()


@pytest.fixture(scope="session")
def _standalone():
    """One standalone cluster (master + 2 one-core workers on 127.0.0.1) for the whole run;
    started by the first test that asks for it (or in the background during the module
    before it), stopped at the end."""
    if not has_java():
        pytest.skip("no Java found: a standalone Spark cluster cannot start")
    future = _EARLY.pop("future", None)
    cluster = future.result() if future is not None else _new_cluster().__enter__()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def standalone_cluster(_standalone):
    """The shared standalone cluster with both workers alive (a worker an earlier test
    killed is started again first)."""
    return _standalone.ensure_workers()


@pytest.fixture(scope="session")
def connect_server():
    """A Spark Connect server (master local[2]) the run starts on 127.0.0.1, with
    sparknet's session settings; stopped at the end."""
    try:
        import grpc  # noqa: F401
        import pyspark.sql.connect.session  # noqa: F401
    except ImportError as exc:
        pytest.skip(f"the Spark Connect client is not installed ({exc}): pip install '.[test]'")
    from helpers.connect_server import ConnectServer
    from sparknet.cluster.engine.session import DEFAULT_CONF

    conf = {k: v for k, v in DEFAULT_CONF.items() if k != "spark.ui.showConsoleProgress"}
    conf.update({"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2",
                 "spark.driver.memory": "2g"})
    with ConnectServer("local[2]", conf) as server:
        yield server


@pytest.fixture(scope="session")
def connect_spark(connect_server):
    """A Spark Connect session: a client of :func:`connect_server` (no SparkContext)."""
    from pyspark.sql.connect.session import SparkSession as RemoteSession

    session = RemoteSession.builder.remote(connect_server.url).getOrCreate()
    yield session
    session.stop()


@pytest.fixture(scope="session")
def mnist_dir():
    """The MNIST folder, or a skip that says what to pass."""
    if not os.path.isdir(MNIST_DIR):
        pytest.skip(f"MNIST not found at {MNIST_DIR}; set SPARKNET_MNIST to the folder of IDX files")
    return MNIST_DIR


@pytest.fixture(scope="session")
def shakespeare_path():
    if not os.path.isfile(SHAKESPEARE):
        pytest.skip(f"Shakespeare text not found at {SHAKESPEARE}; set SPARKNET_SHAKESPEARE to its path")
    return SHAKESPEARE


@pytest.fixture(scope="session")
def digits():
    """scikit-learn's digits as ``(X_train, y_train, X_test, y_test)``: scaled to [0, 1], the
    seeded stratified 25% test split of :func:`sparknet.datasets.load_digits`."""
    from sparknet.datasets import load_digits

    return load_digits(test_size=0.25, seed=0)


@pytest.fixture(scope="session")
def digits_xy():
    """All 1,797 digits as ``(X, y)``: X scaled to [0, 1], y int64 class ids."""
    import numpy as np
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    return (X / 16.0), y.astype(np.int64)


@pytest.fixture(scope="session")
def torch():
    """PyTorch, for the interop tests."""
    return pytest.importorskip("torch", reason="torch not installed: PyTorch interop skipped")


@pytest.fixture(scope="session")
def keras():
    """Keras 3 on the torch backend (unless KERAS_BACKEND says otherwise)."""
    os.environ.setdefault("KERAS_BACKEND", "torch")
    keras = pytest.importorskip("keras", reason="keras not installed: Keras interop skipped")
    print(f"Keras {keras.__version__}, backend {keras.backend.backend()}")
    return keras
