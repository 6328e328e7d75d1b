"""What the paper's experiments at this machine's scale share (``benchmarks/paper/``).

* the machine header (:func:`header`: CPU, caches, the one-thread sgemm rate and the load
  right now, the date);
* the networks of the paper (:func:`fc_model`, :func:`cnn_model`, :func:`char_lstm_model`)
  and its data (:func:`mnist`, :func:`shakespeare`), and synthetic rows shaped like
  MNIST for the size sweeps (:func:`synthetic_mnist`, always labelled ``synthetic``);
* the three Spark set-ups (:func:`session`): ``local[1]``, ``local[2]`` and a standalone
  cluster of two one-core workers on 127.0.0.1, each stopped (and its cluster, and its
  ``/dev/shm`` folders) at the end of the ``with`` block;
* the one-process baseline (``Sequential.fit``, one BLAS thread) and a data-parallel fit,
  both timed per epoch (:func:`one_process_epochs`, :func:`data_parallel_fit`);
* the cost model's predictions from :mod:`sparknet.cluster.planning.cost`, measured on the same
  session just before the run they are compared with (:func:`measure_costs`,
  :func:`predict`); when that module has no ``predict`` yet the columns are NaN and the
  script says so;
* CSV rows and a PNG per figure in ``benchmarks/paper/results/`` (:func:`write_csv`,
  :func:`plot_speedup`; matplotlib is imported inside, it stays optional).

Every script here sets ``OPENBLAS_NUM_THREADS=1`` (through this module, imported first).
"""
from __future__ import annotations

import contextlib
import csv
import datetime
import glob
import json
import math
import os
import shutil
import sys
import time
from typing import Any, Callable, Iterator

# inherited by local-mode workers and standalone executors
os.environ["OPENBLAS_NUM_THREADS"] = "1"
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
DATA = os.path.abspath(os.path.join(BENCH, "..", "..", "shared", "data"))
DEFAULT_MNIST = os.path.join(DATA, "mnist")
DEFAULT_TEXT = os.path.join(DATA, "shakespeare.txt")
for _p in (BENCH, os.path.join(BENCH, "..", "tests")):
    if _p not in sys.path:
        sys.path.insert(0, _p)

#: The Spark set-ups of every figure, and the partitions (or blocks) each gives.
SESSIONS = {"local[1]": 1, "local[2]": 2, "standalone": 2}
#: How the set-ups are named in tables and plots.
LABELS = {"one process": "one process (Sequential.fit, 1 thread)", "local": "Spark local[P]",
          "local[1]": "Spark local[1]", "local[2]": "Spark local[2]",
          "standalone": "standalone 2 x 1 core"}


# -------------------------------------------------------------------------- the machine
def load1() -> float:
    """The one-minute load average."""
    return float(os.getloadavg()[0])


def sgemm() -> float:
    """The one-thread sgemm GFLOP/s (median) measured at the start of this process."""
    from _machine import sgemm_gflops
    return float(sgemm_gflops()[1])


def header(what: str) -> str:
    """The lines every script prints first: what it measures, the date, the machine."""
    from _machine import machine_header
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    return f"{what} ({now})\n{machine_header()}"


# -------------------------------------------------------------------------- networks and data
def fc_model(seed: int = 0, dtype: str = "float32") -> Any:
    """The paper's fully connected net 784-480-160-10 (ReLU hidden layers, softmax)."""
    from sparknet import Dense, Sequential
    return Sequential([Dense(480, activation="relu"), Dense(160, activation="relu"),
                       Dense(10, activation="softmax")], input_shape=(784,), dtype=dtype, seed=seed)


def cnn_model(seed: int = 0) -> Any:
    """The paper's CNN on 28x28x1: conv 5x5x6 - max pool 2 - conv 5x5x12 - max pool 2 -
    conv 4x4x12 (ReLU, valid) - the softmax classifier over its 1x1x12 output."""
    from sparknet import Conv2D, Dense, Flatten, MaxPool2D, Sequential
    return Sequential([Conv2D(6, 5, activation="relu"), MaxPool2D(2),
                       Conv2D(12, 5, activation="relu"), MaxPool2D(2),
                       Conv2D(12, 4, activation="relu"), Flatten(),
                       Dense(10, activation="softmax")], input_shape=(28, 28, 1), seed=seed)


def char_lstm_model(vocab: int, seq_len: int, seed: int = 0, hidden: int = 200,
                    embed: int = 32) -> Any:
    """The paper's character LSTM: embedding, one LSTM of ``hidden`` (200) units over
    ``seq_len`` characters, a softmax over the vocabulary at every step (next character)."""
    from sparknet import LSTM, Dense, Embedding, Sequential
    return Sequential([Embedding(vocab, embed), LSTM(hidden, return_sequences=True),
                       Dense(vocab, activation="softmax")], input_shape=(seq_len,), seed=seed)


def mnist(path: str = DEFAULT_MNIST, images: bool = False) -> tuple[np.ndarray, ...]:
    """Real MNIST, pixels in [0, 1]: ``(X, y, X_test, y_test)``, rows of 784 or 28x28x1 images."""
    from sparknet.datasets import load_mnist
    return load_mnist(path, flat=not images)


def shakespeare(chars: int, seq_len: int,
                path: str = DEFAULT_TEXT) -> tuple[np.ndarray, np.ndarray, int]:
    """The first ``chars`` characters of the Shakespeare corpus cut into windows of
    ``seq_len`` character ids, the labels the next character at every step:
    ``(X (N, seq_len), Y (N, seq_len), vocabulary size)``; the vocabulary is the whole
    corpus's."""
    from sparknet.data import char_vocab
    from sparknet.datasets import load_text
    text = load_text(path)
    vocab, ids = char_vocab(text)
    ids = np.asarray(ids[:chars + 1], np.int64)
    n = (len(ids) - 1) // seq_len
    X = ids[:n * seq_len].reshape(n, seq_len)
    Y = ids[1:n * seq_len + 1].reshape(n, seq_len)
    return X, Y, len(vocab)


def synthetic_mnist(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``n`` synthetic rows shaped like MNIST (784 values in [0, 1], 10 classes from a
    random linear teacher): for timing at sizes MNIST does not have, never for accuracy."""
    rng = np.random.default_rng([seed, n])
    X = rng.random((n, 784), dtype=np.float32)
    W = rng.standard_normal((784, 10)).astype(np.float32)
    y = np.argmax((X - 0.5) @ W, axis=1).astype(np.int64)
    return X, y


# -------------------------------------------------------------------------- Spark set-ups
def wait_executors(spark: Any, n: int, timeout: float = 90.0) -> None:
    """Wait until ``n`` executors (besides the driver) have registered."""
    sc = spark.sparkContext
    deadline = time.time() + timeout
    while sc._jsc.sc().getExecutorMemoryStatus().size() < n + 1:
        if time.time() > deadline:
            raise TimeoutError(f"{n} executors did not register in {timeout:.0f} s")
        time.sleep(0.2)


def remove_own_folders(app_id: str) -> int:
    """Remove the resident folders (``/dev/shm``, the local dirs) whose owner file names
    the application ``app_id`` -- this script's session, never another driver's -- in
    case a run left any; returns how many."""
    from sparknet.cluster.resident import spill
    n = 0
    for base in spill.candidate_bases():
        for folder in glob.glob(os.path.join(base, spill.PREFIX + "*")):
            try:
                with open(os.path.join(folder, spill.OWNER_FILE)) as fh:
                    owner = json.load(fh).get("app_id")
            except (OSError, ValueError):
                continue
            if owner == app_id:
                shutil.rmtree(folder, ignore_errors=True)
                n += 1
    return n


@contextlib.contextmanager
def session(kind: str, driver_memory: str = "6g", executor_memory: str = "3g") -> Iterator[Any]:
    """A SparkSession of set-up ``kind`` (``"local[1]"``, ``"local[2]"`` or
    ``"standalone"``: a master and two one-core workers on 127.0.0.1 started here), with
    sparknet's settings (:data:`sparknet.cluster.engine.session.DEFAULT_CONF`), one BLAS thread
    per task and its Python workers started before it is yielded.  Stopped at the end,
    the cluster too, and any resident folder of this session left behind is removed."""
    if kind not in SESSIONS:
        raise ValueError(f"session kind must be one of {sorted(SESSIONS)}, got {kind!r}")
    from sparknet.cluster.engine.session import get_spark, start_python_workers
    conf = {"spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
            "spark.driver.memory": driver_memory, "spark.driver.host": "127.0.0.1",
            "spark.driver.bindAddress": "127.0.0.1", "spark.executorEnv.OPENBLAS_NUM_THREADS": "1",
            "spark.driver.maxResultSize": "4g"}
    cluster = spark = None
    app_id = ""
    try:
        master = kind
        if kind == "standalone":
            from helpers.standalone_cluster import StandaloneCluster
            cluster = StandaloneCluster(workers=2, cores=1, memory="8g").start()
            master = cluster.url
            conf.update({"spark.executor.cores": "1", "spark.executor.memory": executor_memory})
        spark = get_spark(master, app_name=f"sparknet-paper-{kind}", conf=conf, warm_up=False)
        app_id = spark.sparkContext.applicationId
        spark.sparkContext.setLogLevel("ERROR")
        if cluster is not None:
            wait_executors(spark, 2)
        start_python_workers(spark).join(timeout=120)
        yield spark
    finally:
        if spark is not None:
            spark.stop()
        if cluster is not None:
            cluster.stop()
        if app_id and (left := remove_own_folders(app_id)):
            print(f"removed {left} resident folder(s) this session left", flush=True)


# -------------------------------------------------------------------------- runs
def one_process_epochs(model: Any, X: np.ndarray, y: np.ndarray, batch: int, epochs: int,
                       lr: float = 1e-3) -> list[float]:
    """Seconds of each of ``epochs`` epochs of ``Sequential.fit`` (RMSprop, one BLAS thread)."""
    from sparknet import RMSprop
    h = model.fit(X, y, epochs=epochs, batch_size=batch, optimizer=RMSprop(lr=lr), verbose=0,
                  num_threads=1)
    return [float(t) for t in h["time"]]


def data_parallel_fit(spark: Any, model: Any, X: np.ndarray, y: np.ndarray, partitions: int,
                      batch: int, epochs: int, lr: float = 1e-3, validation: Any = None,
                      **trainer_kw: Any) -> dict:
    """One ``DataParallelTrainer`` fit (synchronous rounds, tau sized by the trainer
    unless ``local_steps`` is given) on numpy input; per-epoch seconds (validation
    excluded), the local steps per round, rounds per epoch, set-up seconds, Spark's
    share of the rounds, the last loss and validation accuracy."""
    from sparknet import RMSprop
    from sparknet.cluster import DataParallelTrainer
    trainer = DataParallelTrainer(model, spark, num_partitions=partitions,
                                  optimizer=RMSprop(lr=lr), **trainer_kw)
    _, h = trainer.fit(X, y, epochs=epochs, batch_size=batch, validation_data=validation, verbose=0,
                       reuse_data=False)
    val_t = h["val_time"] if "val_time" in h else [float("nan")] * len(h["time"])
    times = [float(t) - (0.0 if math.isnan(v) else float(v)) for t, v in zip(h["time"], val_t)]
    return {"epoch_times": times, "epoch_s": float(np.median(times)),
            "tau": int(np.median(h["local_steps"])),
            "rounds_per_epoch": float(np.median(h["rounds"])),
            "setup_s": float(h.setup_time), "spark_share": float(np.mean(h["spark_overhead"])),
            "loss": float(h["loss"][-1]),
            "val_accuracy": list(h["val_accuracy"]) if "val_accuracy" in h else []}


# -------------------------------------------------------------------------- the cost model
def cost_module() -> Any:
    """:mod:`sparknet.cluster.planning.cost` when it has the predictions (``predict``),
    else None."""
    try:
        from sparknet.cluster.planning import cost
    except ImportError:
        return None
    needed = ("SparkCosts", "NetworkCosts", "predict")
    return cost if all(hasattr(cost, n) for n in needed) else None


def measure_costs(spark: Any, model: Any, batch: int, steps: int = 8) -> tuple[Any, Any]:
    """``(SparkCosts, NetworkCosts)`` measured now (the session's probes, then the
    network's steps in this process), or ``(None, None)`` without the cost model."""
    cost = cost_module()
    if cost is None:
        return None, None
    try:
        sc = cost.SparkCosts.measure(spark, repeats=3)
        net = cost.NetworkCosts.measure(model, batch, steps=steps)
    except Exception as exc:   # a benchmark runs to the end: the predicted columns stay NaN
        print(f"cost model: measuring failed ({type(exc).__name__}: {exc}); no predictions",
              flush=True)
        return None, None
    return sc, net


def predict(mode: str, net: Any, spark_costs: Any, samples: int, **settings: Any) -> dict:
    """The cost model's prediction as CSV columns (``pred_epoch_s``, ``pred_step_s``,
    ``pred_one_process_epoch_s``, ``pred_speedup``, ``pred_breakdown``); NaN without it."""
    out: dict[str, Any] = {"pred_epoch_s": math.nan, "pred_step_s": math.nan,
                           "pred_one_process_epoch_s": math.nan, "pred_speedup": math.nan,
                           "pred_breakdown": ""}
    cost = cost_module()
    if cost is None or net is None or spark_costs is None:
        return out
    try:
        p = cost.predict(mode, net, spark_costs, samples, **settings)
    except Exception as exc:
        print(f"cost model: predict({mode!r}, {settings}) failed ({type(exc).__name__}: {exc})",
              flush=True)
        return out
    out.update(pred_epoch_s=float(p.epoch_s),
               pred_one_process_epoch_s=float(p.one_process_epoch_s),
               pred_speedup=float(p.speedup),
               pred_step_s=math.nan if p.step_s is None else float(p.step_s),
               pred_breakdown="; ".join(f"{k} {v:.3g}" for k, v in p.breakdown.items()))
    return out


def cost_note() -> str:
    """One line saying where the predicted columns come from."""
    if cost_module() is None:
        return ("predictions: sparknet.cluster.planning.cost has no predict() in this checkout; "
                "the pred_* columns are NaN (rerun the script once it lands)")
    return ("predictions: sparknet.cluster.planning.cost.predict, its costs measured on the same "
            "session just before each run")


# ------------------------------------------------------------------------- the partitions figure
def partitions_figure(name: str, title: str, make_model: Callable[[], Any], X: np.ndarray,
                      y: np.ndarray, batch: int, epochs: int, data_label: str, lr: float = 1e-3,
                      sessions: tuple[str, ...] = tuple(SESSIONS), baseline_epochs: int = 2,
                      local_steps: Callable[[int], int] | None = None) -> list[dict]:
    """Speedup against partitions for one network.  For every Spark set-up, on its live
    session: the cost model's probes, then ``baseline_epochs`` epochs of one process
    (``Sequential.fit``, one BLAS thread) and right after them the data-parallel fit of
    ``epochs`` epochs (its median epoch kept, set-up excluded), so that the baseline, the
    prediction and the measurement see the same load.  The ``one process`` row holds the
    median of all baseline epochs.  ``local_steps(partitions)`` gives tau (default: the
    trainer's ``"auto"``).  Writes ``results/<name>.csv`` and ``.png`` and returns the rows."""
    print(header(title), flush=True)
    print(f"data: {data_label}; batch {batch}, RMSprop lr {lr}; {cost_note()}", flush=True)
    rows: list[dict] = []
    base_all: list[float] = []
    for kind in sessions:
        parts = SESSIONS[kind]
        with session(kind) as spark:
            sc, net = measure_costs(spark, make_model(), batch)
            base = one_process_epochs(make_model(), X, y, batch, baseline_epochs, lr)
            base_all += base
            t0 = time.perf_counter()
            kw = {} if local_steps is None else {"local_steps": local_steps(parts)}
            r = data_parallel_fit(spark, make_model(), X, y, parts, batch, epochs, lr, **kw)
            wall = time.perf_counter() - t0
            pred = predict("average", net, sc, len(X), partitions=parts, tau=r["tau"])
            one = float(np.median(base))
            row = {"figure": name, "series": kind,
                   "line": "standalone" if kind == "standalone" else "local",
                   "partitions": parts,
                   "mode": "sync average" + (", tau given" if kw else ", tau auto"),
                   "data": data_label, "samples": len(X), "batch": batch, "tau": r["tau"],
                   "rounds_per_epoch": r["rounds_per_epoch"], "epochs_timed": epochs,
                   "epoch_s": r["epoch_s"], "one_process_epoch_s": one,
                   "speedup": one / r["epoch_s"],
                   "setup_s": r["setup_s"], "spark_share": r["spark_share"], "fit_wall_s": wall,
                   "loss": r["loss"], **pred, "load1": load1(), "sgemm_gflops": sgemm()}
            rows.append(row)
            print(f"{kind}: one process {', '.join(f'{t:.2f}' for t in base)} s; "
                  f"{parts} partitions, tau {r['tau']}, {r['rounds_per_epoch']:.2g} rounds/epoch, "
                  f"epochs {', '.join(f'{t:.2f}' for t in r['epoch_times'])} s "
                  f"(set-up {r['setup_s']:.1f} s, Spark share {r['spark_share']:.2f}); "
                  f"speedup {row['speedup']:.2f}x; predicted epoch {pred['pred_epoch_s']:.2f} s, "
                  f"speedup {pred['pred_speedup']:.2f}x [{pred['pred_breakdown']}] "
                  f"(load {load1():.1f})", flush=True)
    one = float(np.median(base_all))
    rows.insert(0, {"figure": name, "series": "one process", "partitions": 1,
                    "mode": "Sequential.fit", "data": data_label, "samples": len(X),
                    "batch": batch, "epochs_timed": len(base_all),
                    "epoch_s": one, "one_process_epoch_s": one, "speedup": 1.0, "load1": load1(),
                    "sgemm_gflops": sgemm()})
    write_csv(name, rows)
    plot_speedup(name, rows, "partitions", title, "partitions (worker cores)", ideal=True)
    print_table(rows)
    return rows


def print_table(rows: list[dict]) -> None:
    """The measured and predicted epoch seconds and speedups, one line per row."""
    print(f"{'series':<14}{'x':>8}{'1-proc s':>10}{'epoch s':>10}{'speedup':>9}{'pred epoch s':>14}"
          f"{'pred speedup':>14}{'load':>7}")
    for r in rows:
        x = r.get("partitions") if "rows" not in r else r["rows"]
        print(f"{r['series']:<14}{x!s:>8}{r['one_process_epoch_s']:>10.3f}{r['epoch_s']:>10.3f}"
              f"{r['speedup']:>8.2f}x"
              f"{r.get('pred_epoch_s', math.nan):>14.3f}{r.get('pred_speedup', math.nan):>13.2f}x"
              f"{r['load1']:>7.1f}", flush=True)


# -------------------------------------------------------------------------- output
def write_csv(name: str, rows: list[dict]) -> str:
    """``results/<name>.csv`` with the union of the rows' keys as columns (first-seen order)."""
    os.makedirs(RESULTS, exist_ok=True)
    cols: list[str] = []
    for r in rows:
        cols += [k for k in r if k not in cols]
    path = os.path.join(RESULTS, f"{name}.csv")
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        for r in rows:
            w.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in r.items()})
    print(f"wrote {os.path.relpath(path)}", flush=True)
    return path


def plot_speedup(name: str, rows: list[dict], x: str, title: str, xlabel: str, ideal: bool = False,
                 logx: bool = False, note: str = "") -> str | None:
    """``results/<name>.png``: measured speedup (filled markers, solid lines) and the cost
    model's predicted speedup (hollow markers, dashed) per series against ``x``; None
    when matplotlib is missing (``pip install matplotlib``)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install matplotlib): no PNG", flush=True)
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.4))
    lines = [s for s in dict.fromkeys(r.get("line", r["series"]) for r in rows)
             if s != "one process"]
    markers = "osD^v"
    for i, s in enumerate(lines):
        pts = sorted((r for r in rows if r.get("line", r["series"]) == s), key=lambda r: r[x])
        shift = 1.0 + 0.02 * i if logx else 0.03 * i     # keep points at the same x apart
        xs = [r[x] * shift if logx else r[x] + shift for r in pts]
        line, = ax.plot(xs, [r["speedup"] for r in pts], marker=markers[i % 5],
                        label=f"{LABELS.get(s, s)}: measured")
        pred = [r.get("pred_speedup", math.nan) for r in pts]
        if any(not math.isnan(p) for p in pred):
            ax.plot(xs, pred, marker=markers[i % 5], linestyle="--", fillstyle="none",
                    color=line.get_color(), label=f"{LABELS.get(s, s)}: predicted")
    if ideal:
        xs = sorted({r[x] for r in rows})
        ax.plot(xs, xs, color="grey", linewidth=0.8, linestyle=":", label="ideal (linear)")
    ax.axhline(1.0, color="black", linewidth=0.6)
    ax.set_ylim(bottom=0)
    if logx:
        ax.set_xscale("log")
    else:
        ax.set_xticks(sorted({r[x] for r in rows}))
    ax.set_xlabel(xlabel)
    ax.set_ylabel("speedup over one process")
    ax.set_title(title, fontsize=10)
    ax.legend(fontsize=7)
    foot = (f"{datetime.date.today().isoformat()}, load {rows[-1]['load1']:.1f}, "
            f"sgemm {rows[-1]['sgemm_gflops']:.0f} GFLOP/s")
    fig.text(0.01, 0.01, f"{note + '; ' if note else ''}{foot}", fontsize=6, color="grey")
    fig.tight_layout(rect=(0, 0.03, 1, 1))
    path = os.path.join(RESULTS, f"{name}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {os.path.relpath(path)}", flush=True)
    return path
