"""The command line's own text: ``--help`` readable (no reST), ``--version``, every option
with help and its default; ``info`` tells the BLAS threads the kernels run with; and the
planner's result prints in a few lines."""
from __future__ import annotations

import argparse
import re

import pytest

import sparknet
from sparknet.__main__ import main


def _help(capsys, *argv: str) -> str:
    with pytest.raises(SystemExit) as info:
        main([*argv, "--help"])
    assert info.value.code == 0
    return capsys.readouterr().out


def test_help_is_plain_text_and_version_is_printed(capsys):
    text = _help(capsys)
    assert "``" not in text and ":func:" not in text and ":class:" not in text and ":mod:" not in text
    for command in ("demo", "train", "export", "plot", "info"):
        assert re.search(rf"^\s+{command}\s+\S", text, re.M), text
    with pytest.raises(SystemExit):
        main(["--version"])
    assert capsys.readouterr().out.strip() == f"sparknet {sparknet.__version__}"


def _subparsers() -> dict[str, argparse.ArgumentParser]:
    """The command parsers, as ``main`` builds them (its parser caught before parsing)."""
    built: dict[str, argparse.ArgumentParser] = {}
    real = argparse.ArgumentParser.parse_args

    def catch(self, *args, **kw):
        for action in self._actions:
            if isinstance(action, argparse._SubParsersAction):
                built.update(action.choices)
        raise SystemExit(0)

    argparse.ArgumentParser.parse_args = catch  # type: ignore[method-assign]
    try:
        with pytest.raises(SystemExit):
            main(["info"])
    finally:
        argparse.ArgumentParser.parse_args = real  # type: ignore[method-assign]
    return built


def test_every_option_has_help_and_names_its_default(capsys):
    parsers = _subparsers()
    assert set(parsers) >= {"demo", "train", "export", "plot", "info"}
    missing = []
    for name, parser in parsers.items():
        text = _help(capsys, name)
        for action in parser._actions:
            if not action.option_strings or action.dest == "help":
                continue
            if not action.help:
                missing.append(f"{name} {action.option_strings[0]}: no help")
            elif action.default not in (None, False) and "default" not in action.help:
                missing.append(f"{name} {action.option_strings[0]}: default {action.default!r} not said")
        assert "``" not in text, text
    assert not missing, "\n".join(missing)
    demo = _help(capsys, "demo")
    assert "(default: 40)" in demo and "(default: 0)" in demo


def test_info_reports_the_threads_the_kernels_run_with(capsys):
    pytest.importorskip("threadpoolctl")
    from sparknet import threads

    before = threads.get_num_threads()
    try:
        threads.set_num_threads(1)
        assert main(["info"]) == 0
        out = capsys.readouterr().out
        assert "BLAS threads: sparknet's kernels run 1 thread " in out, out
        assert all("1 thread in sparknet's kernels (its pool: " in ln for ln in out.splitlines()
                   if ln.startswith("BLAS: ")), out
    finally:
        threads.set_num_threads(before)


def test_a_plan_prints_in_a_few_lines_and_keeps_its_table():
    from sparknet.cluster.planning import cost
    from sparknet.cluster.planning import planner as pl

    net = cost.NetworkCosts(sample_s=3e-4, eval_sample_s=1e-4, param_bytes=1 << 20, activation_bytes=[512, 40],
                            flops_per_sample=0.0, gemm_gflops=90.0, batch_size=128, update_s=1e-4,
                            n_params=(1 << 20) // 4)
    p = pl.plan_from_costs(net, cost.SparkCosts.assumed(5, 18, bandwidth_gbit=1.0), 1_000_000,
                           modes=["gradient", "average", "async"], taus=[16, 64], threads=[1, 18])
    text = repr(p)
    assert len(text.splitlines()) <= 10 and len(text) < 1000, text
    assert pl.describe(p.best) in text and "table()" in text
    assert str(p) == p.explain()
    table = p.table().splitlines()
    assert len(table) == len(p.candidates) + len(p.ruled_out) and table[0].endswith(pl.describe(p.best))


@pytest.mark.parametrize("argv,want", [
    (["demo", "--epochs", "-1"], "argument --epochs: must be a positive integer, got -1"),
    (["demo", "--epochs", "x"], "argument --epochs: not an integer: 'x'"),
    (["demo", "--log-level", "loud"], "argument --log-level: not a logging level: 'loud'"),
    (["train", "--lr", "0"], "argument --lr: must be a positive number, got 0"),
    (["train", "--lr", "nan"], "argument --lr: must be a positive number, got nan"),
    (["train", "--batch-size", "0"], "argument --batch-size: must be a positive integer, got 0"),
    (["train", "--hidden", "512,abc"], "argument --hidden: not an integer: 'abc'"),
])
def test_a_bad_option_value_is_a_usage_error_naming_the_option(capsys, argv, want):
    """Refused by the parser (exit status 2, one line naming the option), before Spark or
    any data is touched; not a traceback from deep inside the run."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"python -m sparknet {argv[0]}: error: {want}" in err and "Traceback" not in err, err


def test_a_log_level_in_any_case_is_taken(monkeypatch):
    seen = {}

    def demo(args):
        seen["level"] = args.log_level
        return 0

    monkeypatch.setattr("sparknet.__main__.cmd_demo", demo)
    assert main(["demo", "--log-level", "debug"]) == 0
    assert seen["level"] == "DEBUG"


def test_demo_remote_takes_a_connect_url_and_says_when_its_server_is_not_there(capsys):
    """``--remote host:port`` (no ``sc://``) is a usage error that writes the URL out; an
    ``sc://`` URL with no server behind it fails at once naming host, port and the reason,
    where the Connect client would retry for minutes; neither starts a JVM."""
    import socket

    with pytest.raises(SystemExit) as info:
        main(["demo", "--remote", "localhost:15002"])
    assert info.value.code == 2
    assert ("argument --remote: 'localhost:15002' is not a Spark Connect URL: write "
            "sc://localhost:15002 (or local[2] for a local Connect server)") in capsys.readouterr().err
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    assert main(["demo", "--remote", f"sc://127.0.0.1:{port}", "--epochs", "1"]) == 2
    err = capsys.readouterr().err
    assert (f"sparknet demo: cannot reach the Spark Connect server at sc://127.0.0.1:{port} "
            f"(127.0.0.1:{port}: Connection refused); start one") in err, err
