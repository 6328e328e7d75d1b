"""Command line: ``python -m sparknet demo | train | export | plot | info``.

- ``demo``: train an MLP on scikit-learn's bundled digits and print the test accuracy
  (on local Spark through the data-parallel trainer when ``sparknet.cluster`` and Java
  are available, in one process with ``--local``, from a Spark Connect client with
  ``--remote sc://host:port``, or ``--remote local[2]`` for a Connect server pyspark
  starts here);
- ``train``: train an MLP on digits or on MNIST IDX files and save the model file;
- ``export``: write a saved model file as an ONNX file (:func:`sparknet.onnx.export`);
- ``plot``: draw a saved :class:`~sparknet.history.History` (JSON) to a PNG;
- ``info``: versions and the BLAS the kernels use, with the thread count they run with, and
  the paths of float32 and bfloat16 products (AVX-512, AVX512-BF16, AMX) on this CPU.
"""
from __future__ import annotations

import argparse
import logging
import shutil
import sys
import time
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sparknet.model import Sequential

_DESCRIPTION = """\
sparknet: neural networks trained in one process or on Apache Spark.

Run `python -m sparknet COMMAND --help` for a command's options and their defaults."""

_EXAMPLES = """\
examples:
  python -m sparknet demo                  digits on local Spark (Java 17+ needed)
  python -m sparknet demo --local          the same in one process
  python -m sparknet train --out model.npz
  python -m sparknet export model.npz model.onnx   an ONNX file (pip install 'sparknet[onnx]')
  python -m sparknet info                  versions, Java, the BLAS threads in use"""


def _digits_mlp(seed: int = 0) -> Sequential:
    from sparknet import Dense, Dropout, Sequential
    return Sequential([Dense(256, activation="relu"), Dropout(0.2), Dense(128, activation="relu"),
                       Dropout(0.2), Dense(10, activation="softmax")], seed=seed)


def _demo_local(args: argparse.Namespace) -> float:
    from sparknet import RMSprop
    from sparknet.datasets import load_digits
    Xtr, ytr, Xte, yte = load_digits(seed=args.seed)
    model = _digits_mlp(args.seed)
    model.fit(Xtr, ytr, epochs=args.epochs, batch_size=32, optimizer=RMSprop(lr=1e-3),
              validation_data=(Xte, yte), verbose=0 if args.quiet else args.verbose)
    return model.evaluate(Xte, yte)["accuracy"]


def _demo_spark(args: argparse.Namespace) -> float:
    from sparknet.cluster import demo as cluster_demo
    spark = None
    if args.remote:
        from pyspark.sql import SparkSession
        if not args.quiet and args.verbose:
            print(f"sparknet demo: connecting to Spark Connect ({args.remote}) ...",
                  file=sys.stderr, flush=True)
        spark = SparkSession.builder.remote(args.remote).getOrCreate()
    return cluster_demo(spark, epochs=args.epochs, seed=args.seed,
                        verbose=0 if args.quiet else args.verbose)


def cmd_demo(args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    mode = "one process"
    use_spark = not args.local
    if use_spark:
        try:
            import sparknet.cluster as _cluster
            use_spark = hasattr(_cluster, "demo")
        except ImportError:
            use_spark = False
    needs_java = not (args.remote or "").startswith("sc://")  # a Connect client needs no JVM
    if use_spark and needs_java and shutil.which("java") is None:
        print("sparknet demo: Spark needs Java 17+, and no `java` is on PATH; install a JDK "
              "(e.g. apt-get install openjdk-17-jre-headless) or run `python -m sparknet demo "
              "--local`",
              file=sys.stderr)
        return 2
    if use_spark and (args.remote or "").startswith("sc://"):
        why = _unreachable(args.remote)
        if why is not None:
            print(f"sparknet demo: cannot reach the Spark Connect server at {args.remote} "
                  f"({why}); start one (e.g. $SPARK_HOME/sbin/start-connect-server.sh) or "
                  f"check the URL, or run `python -m sparknet demo --remote local[2]` for a "
                  f"local one", file=sys.stderr)
            return 2
    if use_spark:
        mode = f"Spark Connect {args.remote}" if args.remote else "local Spark"
        acc = _demo_spark(args)
    else:
        acc = _demo_local(args)
    print(f"digits MLP ({mode}): test accuracy {acc:.4f} in {time.perf_counter() - t0:.1f} s")
    return 0 if acc >= 0.97 else 1


def cmd_train(args: argparse.Namespace) -> int:
    from sparknet import Dense, RMSprop, Sequential
    from sparknet.datasets import load_digits, load_mnist
    if args.data == "digits":
        Xtr, ytr, Xte, yte = load_digits(seed=args.seed)
    else:
        if not args.mnist_dir:
            print("sparknet train: --data mnist needs --mnist-dir (the folder of IDX files, "
                  "e.g. ../shared/data/mnist)", file=sys.stderr)
            return 2
        Xtr, ytr, Xte, yte = load_mnist(args.mnist_dir)
    model = Sequential([Dense(h, activation="relu") for h in args.hidden]
                       + [Dense(10, activation="softmax")], seed=args.seed)
    model.fit(Xtr, ytr, epochs=args.epochs, batch_size=args.batch_size,
              optimizer=RMSprop(lr=args.lr), validation_data=(Xte, yte), verbose=1)
    res = model.evaluate(Xte, yte)
    print(f"test loss {res['loss']:.4f}, test accuracy {res['accuracy']:.4f}")
    if args.out:
        model.save(args.out)
        print(f"saved {args.out}")
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from sparknet.errors import CheckpointError
    from sparknet.io import load_model
    try:
        from sparknet.onnx import export
    except ImportError as exc:
        print(f"sparknet export: needs the onnx package ({exc}): pip install 'sparknet[onnx]'",
              file=sys.stderr)
        return 2
    try:
        model = load_model(args.model)
        proto = export(model, args.out, opset=args.opset)
    except (OSError, ValueError, CheckpointError) as exc:
        print(f"sparknet export: {exc}", file=sys.stderr)
        return 2

    def describe(values: list) -> str:
        dims = [tuple(d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim)
                for v in values]
        return ", ".join(f"{v.name} {shape}" for v, shape in zip(values, dims))
    print(f"wrote {args.out} (opset {proto.opset_import[0].version}; "
          f"inputs: {describe(proto.graph.input)}; outputs: {describe(proto.graph.output)})")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    import numpy
    import scipy

    import sparknet
    print(f"sparknet {sparknet.__version__}, numpy {numpy.__version__}, scipy {scipy.__version__}, "
          f"python {sys.version.split()[0]}")
    try:
        import pyspark
        print(f"pyspark {pyspark.__version__}; java: {shutil.which('java') or 'not found'}")
    except ImportError:
        print("pyspark: not installed")
    try:
        from threadpoolctl import threadpool_info

        from sparknet.threads import get_num_threads
        limit = get_num_threads()
        for d in threadpool_info():
            if d.get("user_api") != "blas":
                continue
            pool = int(d.get("num_threads") or 1)
            used = pool if limit is None else min(limit, pool)
            print(f"BLAS: {d.get('internal_api')} {d.get('version')} ({d.get('architecture')}), "
                  f"{used} thread{'s' if used != 1 else ''} in sparknet's kernels (its pool: "
                  f"{pool}): {d.get('filepath')}")
        runs = ("the BLAS pool's count" if limit is None
                else f"{limit} thread{'s' if limit != 1 else ''}")
        print(f"BLAS threads: sparknet's kernels run {runs} "
              f"(sparknet.threads.set_num_threads, or fit(num_threads=...), changes it)")
    except ImportError:
        pass
    from sparknet.precision import describe
    print(describe())
    return 0


def cmd_plot(args: argparse.Namespace) -> int:
    from sparknet.history import History
    try:
        history = History.load(args.history)
        out = args.out or (args.history.rsplit(".", 1)[0] + ".png")
        history.plot(out, title=args.title)
    except (ValueError, ImportError) as exc:
        print(f"sparknet plot: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out} ({len(history.epoch)} epochs)")
    return 0


def _positive_int(text: str) -> int:
    """argparse type: an integer > 0 (argparse names the option in its error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {value}")
    return value


def _positive_float(text: str) -> float:
    """argparse type: a finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be a positive number, got {text}")
    return value


def _widths(text: str) -> list[int]:
    """argparse type: comma-separated positive layer widths (``"512,256"``; empty: none)."""
    return [_positive_int(part) for part in text.split(",") if part.strip()]


def _remote_url(text: str) -> str:
    """argparse type: a Spark Connect URL (``sc://host[:port][/;params]``) or a local master
    (``local``, ``local[2]``) for a local Connect server."""
    if text.startswith("sc://") or text == "local" or text.startswith("local["):
        return text
    rest = text.split("://", 1)[-1]
    hint = f"sc://{rest}" if "/" not in rest else "sc://host:15002"
    raise argparse.ArgumentTypeError(f"{text!r} is not a Spark Connect URL: write {hint} (or "
                                     f"local[2] for a local Connect server)")


def _unreachable(url: str, timeout: float = 10.0) -> str | None:
    """Why the Spark Connect server at ``url`` (``sc://host[:port]...``) cannot be reached
    over TCP, or None when it can: the Connect client itself retries for minutes."""
    import socket
    from urllib.parse import urlsplit

    where = urlsplit("http://" + url[len("sc://"):].split("/;", 1)[0].split(";", 1)[0])
    host, port = where.hostname or "localhost", where.port or 15002
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return f"{host}:{port}: {exc.strerror or exc}"


def _log_level(text: str) -> str:
    """argparse type: a logging level name, any case."""
    level = text.upper()
    if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
        raise argparse.ArgumentTypeError(f"not a logging level: {text!r} (DEBUG, INFO, WARNING, "
                                         f"ERROR or CRITICAL)")
    return level


def main(argv: list[str] | None = None) -> int:
    from sparknet import __version__

    parser = argparse.ArgumentParser(prog="python -m sparknet", description=_DESCRIPTION,
                                     epilog=_EXAMPLES,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"sparknet {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    d = sub.add_parser("demo", help="train on the bundled digits and print test accuracy")
    d.add_argument("--epochs", type=_positive_int, default=40,
                   help="passes over the training data (default: %(default)s)")
    d.add_argument("--seed", type=int, default=0,
                   help="seeds the split, the initial weights and the shuffles (default: "
                        "%(default)s)")
    d.add_argument("--local", action="store_true", help="train in one process instead of on local "
                                                        "Spark")
    d.add_argument("--remote", type=_remote_url, default=None, metavar="URL",
                   help="train from a Spark Connect client: sc://host:port, or local[2] for a "
                        "local Connect server (default: local Spark, no Connect)")
    d.add_argument("--quiet", action="store_true", help="no progress output (as --verbose 0)")
    d.add_argument("--verbose", type=int, choices=(0, 1, 2), default=1,
                   help="0 nothing, 1 a live progress bar and a line per epoch, 2 the lines alone "
                        "(default: %(default)s)")
    d.add_argument("--log-level", type=_log_level, default="WARNING",
                   help="logging level of sparknet's diagnostics: DEBUG, INFO, WARNING, ERROR "
                        "(default: %(default)s)")
    d.set_defaults(func=cmd_demo)
    t = sub.add_parser("train", help="train an MLP on digits or MNIST and save it")
    t.add_argument("--data", choices=["digits", "mnist"], default="digits",
                   help="scikit-learn's digits, or MNIST from --mnist-dir (default: %(default)s)")
    t.add_argument("--mnist-dir", default=None, help="folder of the MNIST IDX files (needed by "
                                                     "--data mnist)")
    t.add_argument("--hidden", type=_widths, default="512,256",
                   help="hidden layer widths, comma separated (default: %(default)s)")
    t.add_argument("--epochs", type=_positive_int, default=10,
                   help="passes over the training data (default: %(default)s)")
    t.add_argument("--batch-size", type=_positive_int, default=128,
                   help="rows per optimizer step (default: %(default)s)")
    t.add_argument("--lr", type=_positive_float, default=1e-3,
                   help="RMSprop's learning rate (default: %(default)s)")
    t.add_argument("--seed", type=int, default=0,
                   help="seeds the initial weights and shuffles (default: %(default)s)")
    t.add_argument("--out", default=None, help="model file to write (.npz; default: none, nothing "
                                               "is saved)")
    t.set_defaults(func=cmd_train)
    e = sub.add_parser("export", help="write a saved model (.npz) as an ONNX file")
    e.add_argument("model", help="a model file written by Sequential.save (.npz)")
    e.add_argument("out", help="the ONNX file to write (.onnx)")
    e.add_argument("--opset", type=int, default=None,
                   help="the ai.onnx opset to write (default 17)")
    e.set_defaults(func=cmd_export)
    p = sub.add_parser("plot", help="draw a saved History (JSON) to a PNG")
    p.add_argument("history", help="a file written by History.save")
    p.add_argument("-o", "--out", default=None, help="picture to write (default: the history's "
                                                     "name, .png)")
    p.add_argument("--title", default=None, help="the figure's title (default: none)")
    p.set_defaults(func=cmd_plot)
    i = sub.add_parser("info", help="versions, Java, and the BLAS threads sparknet's kernels run "
                                    "with")
    i.set_defaults(func=cmd_info)
    args = parser.parse_args(argv)
    level = str(getattr(args, "log_level", "INFO")).upper()
    logging.basicConfig(level=getattr(logging, level, logging.WARNING),
                        format="%(asctime)s %(name)s: %(message)s")
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
