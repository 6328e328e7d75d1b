"""The paper's experiments simulated at the paper's scale and past it, from costs measured here.

Measured on this machine, in this run: Spark's per-job, per-task and per-MiB costs
(``SparkCosts.measure`` on a ``local[2]`` session) and each network's training step on one
core (``NetworkCosts.measure``: the paper's FC 784-480-160-10 and CNN on MNIST-shaped rows,
the char LSTM of 200 units over 50 characters of Shakespeare, batch 128 for FC/CNN and 64 for
the LSTM; a blocked FC ``4096 -> W -> W -> 10`` measured at W = 4096 and scaled by its
FLOPs to the widths of the model-size sweep).  **Assumed** (we have no cluster): the paper's
5 hosts of 18 cores (88 cores used), **1 Gb/s Ethernet assumed** with 0.2 ms latency
between hosts (``SparkCosts.assumed``), tasks on cores of their own (``task_speed`` 1, where
this shared machine measures its contention), 64 GiB per host, task speeds lognormal with
``sigma = 0.1`` (stragglers), and 10x (50 hosts, 880 cores) and 100x (500 hosts, 8,800
cores) that.  One process = the same network on one core here, no Spark.

Each point is the planner's best candidate on that cluster
(:func:`sparknet.cluster.planning.planner.plan_from_costs`: mode, partitions, tau, BLAS threads
per task, K, pairing, D x K), ranked by
the closed-form cost model and the best few re-run through the simulation with stragglers
(:mod:`sparknet.cluster.planning.simulate`).  Epoch times only: ``sync="average"`` and ``async``
change the optimisation (tau local steps), so a speedup per epoch is a speedup to accuracy
only when they need as many epochs as one process (see docs/scaling.rst); ``gradient``
(exact minibatch SGD) is printed beside them.

Two sets of Spark costs are run: those measured here now (the machine is shared: a loaded
2-core machine inflates ``job_s``, ``task_s`` -- a second wave of tasks on two cores -- and
the per-MiB costs, so these figures are pessimistic for a cluster) and ``cost.REFERENCE``
(the reference machine, idle).  The PNGs show the measured set; the CSV holds both
(``costs`` column).  Writes ``results/simulated_speedup.csv`` and
``results/simulated_{data,model_size,lstm}.png``.

    python benchmarks/paper/simulate_paper.py [--no-spark] [--quick]
"""
from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import _common as C  # noqa: E402  (sets OPENBLAS_NUM_THREADS=1 first)

from sparknet.cluster.planning import cost  # noqa: E402
from sparknet.cluster.planning import planner as pl  # noqa: E402
from sparknet.cluster.planning import simulate as sim  # noqa: E402

NAME = "simulated_speedup"
CORES_PER_HOST = 18
HOST_MEMORY = 64 << 30
STRAGGLERS = sim.Stragglers(sigma=0.1)
SCALES = {"paper (5 hosts)": [1, 2, 4, 8, 16, 32, 64, 88],
          "10x (50 hosts)": [88, 176, 352, 528, 880],
          "100x (500 hosts)": [880, 1760, 3520, 5280, 8800]}
SAMPLES = (100_000, 1_000_000, 5_000_000)
#: 4096 -> W -> W -> 10: 5.2M .. 4.03B parameters
WIDTHS = (1024, 2048, 4096, 8192, 16384, 32768, 61440)
MODEL_IN = 4096
LSTM_WINDOWS = 101_145   # the whole corpus (5,057,282 characters) in windows of 50
#: the paper's reported points: (what, net, samples, cores, its speedup)
PAPER = [("CNN, 5M samples, 5 nodes", "cnn", 5_000_000, 88, 11.0),
         ("FC, 0.1M samples, 88 cores", "fc", 100_000, 88, 7.2),
         ("4B-parameter FC, 10 partitions", "fc4b", 100_000, 10, 5.6),
         ("char LSTM, 5 nodes", "lstm", LSTM_WINDOWS, 88, 1.59)]


def cluster(cores: int, like: cost.SparkCosts) -> tuple[cost.SparkCosts, int]:
    """The assumed cluster of ``cores`` cores (hosts of :data:`CORES_PER_HOST`), 1 Gb/s, its
    tasks on cores of their own (``task_speed`` 1: the speed measured here is this shared
    2-core machine's contention, not a cluster's)."""
    hosts = max(1, math.ceil(cores / CORES_PER_HOST))
    per_host = math.ceil(cores / hosts)
    sc = cost.SparkCosts.assumed(hosts, per_host, bandwidth_gbit=1.0, latency_ms=0.2, like=like)
    return dataclasses.replace(sc, task_speed=1.0), cores


def taus_for(samples: int, cores: int, batch: int) -> list[int]:
    """A coarse tau grid: powers of four, and one, two and four epochs' steps at every
    partition count."""
    out = {4 ** k for k in range(8)}
    for p in {1, cores, max(1, cores // CORES_PER_HOST)}:
        steps = max(1, math.ceil(math.ceil(samples / p) / batch))
        out.update({steps, 2 * steps, 4 * steps})
    return sorted(out)


#: BLAS threads per task the sweeps consider: one task per core, a few, or one per host
#: (BigDL's way)
THREADS = [1, 2, 6, CORES_PER_HOST]


def best_plan(net: cost.NetworkCosts, sc: cost.SparkCosts, samples: int, cores: int,
              modes: list[str], layout: pl.DenseLayout | None = None, keep: int = 6,
              threads: list[int] | None = None) -> tuple[pl.Plan, cost.Prediction]:
    """The planner on the cluster (closed form), its best ``keep`` per mode re-run through
    the simulation with stragglers; returns the plan and the best simulated prediction."""
    threads = [t for t in (threads or THREADS) if t <= sc.cores_per_host]
    p = pl.plan_from_costs(net, sc, samples, modes=modes, layout=layout, max_partitions=cores,
                           taus=taus_for(samples, cores, net.batch_size), threads=threads,
                           memory=HOST_MEMORY, sample_bytes=4 * 784 + 8)
    def used(c: cost.Prediction) -> int:   # cores a candidate takes (the hosts may hold a few more)
        s = c.settings
        return s.get("threads", 1) * (s.get("partitions") or s.get("K", 1) * s.get("D", 1))

    sims = []
    for mode in modes:
        for c in [c for c in p.candidates if c.mode == mode and used(c) <= cores][:keep]:
            s = {k: v for k, v in c.settings.items()
                 if k in ("partitions", "tau", "threads", "K", "paired", "D")}
            if c.mode in ("model_parallel", "hybrid"):
                s.update(layer_sizes=list(layout.widths),  # type: ignore[union-attr]
                         blocked=list(layout.blocked))  # type: ignore[union-attr]
            sims.append(sim.simulate(mode, net, sc, samples, stragglers=STRAGGLERS, **s))
    return p, pl.rank(sims)[0]


def measure_nets(spark_ok: bool) -> tuple[cost.SparkCosts, dict[str, cost.NetworkCosts], float]:
    """Spark's costs (a local[2] session, or the reference figures with --no-spark) and every
    network's."""
    sgemm = C.sgemm()
    here = cost.REFERENCE
    if spark_ok:
        with C.session("local[2]") as spark:
            here = cost.SparkCosts.measure(spark)
    from sparknet import Dense, Sequential
    nets = {"fc": cost.NetworkCosts.measure(C.fc_model(), 128),
            "cnn": cost.NetworkCosts.measure(C.cnn_model(), 128),
            "lstm": cost.NetworkCosts.measure(C.char_lstm_model(65, 50), 64)}
    ref = Sequential([Dense(4096, activation="relu"), Dense(4096, activation="relu"),
                      Dense(10, activation="softmax")], input_shape=(MODEL_IN,))
    nets["blocked4096"] = cost.NetworkCosts.measure(ref, 128, steps=3)
    return here, nets, sgemm


def blocked_net(ref: cost.NetworkCosts, width: int) -> tuple[cost.NetworkCosts, pl.DenseLayout]:
    """The ``4096 -> W -> W -> 10`` net's costs scaled from the measured W = 4096 one by FLOPs."""
    widths = (MODEL_IN, width, width, 10)
    n = sum(a * b + b for a, b in zip(widths, widths[1:]))
    flops = sum(2.0 * a * b * (3.0 if i else 2.0)
                for i, (a, b) in enumerate(zip(widths, widths[1:])))
    scale = flops / ref.flops_per_sample
    net = dataclasses.replace(ref, sample_s=ref.sample_s * scale,
                              eval_sample_s=ref.eval_sample_s * scale, param_bytes=4 * n,
                              activation_bytes=[4 * width, 4 * width, 40], flops_per_sample=flops,
                              update_s=ref.update_s * n / max(ref.n_params, 1), n_params=n,
                              step_fixed_s=0.0)
    return net, pl.DenseLayout(widths, (0, 1))


def row(fig: str, scale: str, net: str, samples: int, cores: int, p: cost.Prediction,
        grad: float | None) -> dict:
    s = p.settings
    return {"figure": fig, "scale": scale, "net": net, "samples": samples, "cores": cores,
            "mode": p.mode, "settings": pl.describe(p).split(":")[0], "epoch_s": p.epoch_s,
            "one_process_s": p.one_process_epoch_s, "speedup": p.speedup,
            "efficiency": p.speedup / cores,
            "gradient_speedup": grad, "hosts": s.get("hosts"), "stragglers": STRAGGLERS.describe(),
            "breakdown": json.dumps({k: round(v, 4) for k, v in p.breakdown.items()})}


def data_sweep(here: cost.SparkCosts, nets: dict, quick: bool) -> list[dict]:
    rows = []
    for scale, cores_list in SCALES.items():
        for name in ("fc", "cnn"):
            for n in SAMPLES:
                for cores in (cores_list[-2:] if quick else cores_list):
                    sc, _ = cluster(cores, here)
                    _, best = best_plan(nets[name], sc, n, cores, ["average", "async"])
                    grad = pl.plan_from_costs(nets[name], sc, n, modes=["gradient"],
                                              max_partitions=cores, threads=[1]).best
                    rows.append(row("data", scale, name, n, cores, best, grad.speedup))
    return rows


def model_sweep(here: cost.SparkCosts, nets: dict, quick: bool) -> list[dict]:
    rows = []
    for scale, cores_list in SCALES.items():
        cores = cores_list[-1]
        sc, _ = cluster(cores, here)
        for w in (WIDTHS[-3:] if quick else WIDTHS):
            net, layout = blocked_net(nets["blocked4096"], w)
            # hybrid only below 1B parameters: its combine moves D x the weights through the
            # driver per step
            for mode in ["average", "model_parallel"] + (["hybrid"] if net.n_params < 1e9 else []):
                try:
                    _, best = best_plan(net, sc, 100_000, cores, [mode], layout, keep=4)
                except ValueError:   # nothing of this mode fits an executor's memory
                    continue
                label = f"fc 4096-{w}-{w}-10 ({net.n_params / 1e6:.4g}M)"
                rows.append(row("model_size", scale, label, 100_000, cores, best, None))
    sc, _ = cluster(88, here)
    net, layout = blocked_net(nets["blocked4096"], WIDTHS[-1])
    # the paper's 10 partitions: the best plan on 10 of the 5 hosts' cores
    _, best = best_plan(net, sc, 100_000, 10, ["model_parallel"], layout, keep=4,
                        threads=[1, 2, 5, 10])
    rows.append(row("4b_10cores", "paper (5 hosts)", "fc 4B", 100_000, 10, best, None))
    # the paper's saturation curve: K blocks, 4B parameters
    for K in (1, 2, 4, 6, 8, 10, 16, 32, 64, 88):
        for threads in (1, CORES_PER_HOST):
            if K * threads <= 5 * CORES_PER_HOST and (threads == 1 or K <= 5):
                p = sim.simulate("model_parallel", net, sc, 100_000, K=K, paired=True,
                                 threads=threads, layer_sizes=list(layout.widths),
                                 blocked=list(layout.blocked), stragglers=STRAGGLERS)
                rows.append(row("4b_vs_K", f"paper, {threads} thread(s)/slot", "fc 4B", 100_000,
                                K * threads, p, None))
    return rows


def lstm_sweep(here: cost.SparkCosts, nets: dict, quick: bool) -> list[dict]:
    rows = []
    for scale, cores_list in SCALES.items():
        for cores in (cores_list[-2:] if quick else cores_list):
            sc, _ = cluster(cores, here)
            _, best = best_plan(nets["lstm"], sc, LSTM_WINDOWS, cores, ["average", "async"])
            grad = pl.plan_from_costs(nets["lstm"], sc, LSTM_WINDOWS, modes=["gradient"],
                                      max_partitions=cores, threads=[1]).best
            rows.append(row("lstm", scale, "char LSTM 200", LSTM_WINDOWS, cores, best,
                            grad.speedup))
    return rows


def paper_table(rows: list[dict], label: str) -> list[str]:
    """The simulated speedups at the paper's reported points, beside the paper's."""
    out = [f"Spark costs: {label}",
           f"{'paper point':<34}{'paper':>7}{'simulated':>11}{'eff.':>7}  {'gradient':>9}  plan",
           "-" * 110]
    for what, net, n, cores, theirs in PAPER:
        if net == "fc4b":
            cand = [r for r in rows if r["figure"] == "4b_10cores"]
        else:
            cand = [r for r in rows
                    if r["figure"] in ("data", "lstm") and r["scale"].startswith("paper")
                    and r["net"].startswith(net.replace("lstm", "char")) and r["samples"] == n
                    and r["cores"] == cores]
        if not cand:
            out.append(f"{what:<34}{theirs:>6.2f}x  (not simulated in this run)")
            continue
        r = max(cand, key=lambda r: r["speedup"])
        g = f"{r['gradient_speedup']:.2f}x" if r["gradient_speedup"] else "-"
        ok = "meets" if r["speedup"] >= theirs else "BELOW"
        out.append(f"{what:<34}{theirs:>6.2f}x{r['speedup']:>10.1f}x"
                   f"{100 * r['efficiency']:>6.0f}%  {g:>9}  {r['settings']} [{ok}]")
    return out


def plot(rows: list[dict]) -> list[str]:
    """The PNGs (matplotlib imported here: it stays optional)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed (pip install matplotlib): no PNG written")
        return []
    paths = []
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
    for ax, scale in zip(axes, SCALES):
        for name in ("fc", "cnn"):
            for n in SAMPLES:
                pts = [r for r in rows if r["figure"] == "data" and r["scale"] == scale
                       and r["net"] == name and r["samples"] == n]
                ax.plot([r["cores"] for r in pts], [r["speedup"] for r in pts],
                        "o-" if name == "cnn" else "s--", label=f"{name.upper()} {n / 1e6:g}M")
        xs = SCALES[scale]
        ax.plot(xs, xs, ":", color="grey", label="linear")
        ax.set(xscale="log", yscale="log", xlabel="cores", ylabel="speedup over one process",
               title=scale)
        ax.grid(True, which="both", alpha=0.3)
    axes[0].scatter([88, 88], [11.0, 7.2], marker="*", s=160, color="black", zorder=5,
                    label="paper (CNN 5M, FC 0.1M)")
    axes[0].legend(fontsize=7)
    fig.suptitle("Simulated speedup vs cores (1 Gb/s Ethernet assumed, stragglers sigma=0.1; "
                 "costs measured here)")
    paths.append(_save(fig, "simulated_data.png"))
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(13, 4.8))
    for scale in SCALES:
        for mode, style in (("average", ":"), ("model_parallel", "-"), ("hybrid", "--")):
            pts = [r for r in rows
                   if r["figure"] == "model_size" and r["scale"] == scale and r["mode"] == mode]
            if pts:
                ax.plot([float(r["net"].split("(")[1].rstrip("M)")) * 1e6 for r in pts],
                        [r["speedup"] for r in pts],
                        "o" + style, label=f"{mode}, {scale}, {pts[0]['cores']} cores")
    ax.scatter([4e9], [5.6], marker="*", s=160, color="black", zorder=5, label="paper (4B, 5.6x)")
    ax.set(xscale="log", yscale="log", xlabel="parameters", ylabel="speedup",
           title="best plan of each mode vs model size (4096-W-W-10)")
    ax.legend(fontsize=7)
    for label in sorted({r["scale"] for r in rows if r["figure"] == "4b_vs_K"}):
        pts = [r for r in rows if r["figure"] == "4b_vs_K" and r["scale"] == label]
        bx.plot([r["cores"] for r in pts], [r["speedup"] for r in pts], "o-",
                label=f"K blocks, {label}")
    bx.scatter([10], [5.6], marker="*", s=160, color="black", zorder=5, label="paper")
    bx.set(xlabel="cores (K x threads)", ylabel="speedup",
           title="4B parameters, paired, vs K (5 hosts)")
    bx.legend(fontsize=7)
    paths.append(_save(fig, "simulated_model_size.png"))
    fig, ax = plt.subplots(figsize=(6.5, 4.8))
    for scale in SCALES:
        pts = [r for r in rows if r["figure"] == "lstm" and r["scale"] == scale]
        ax.plot([r["cores"] for r in pts], [r["speedup"] for r in pts], "o-", label=scale)
    ax.scatter([88], [1.59], marker="*", s=160, color="black", zorder=5, label="paper (5 nodes)")
    ax.set(xscale="log", yscale="log", xlabel="cores", ylabel="speedup",
           title="char LSTM 200 units")
    ax.legend(fontsize=7)
    paths.append(_save(fig, "simulated_lstm.png"))
    return paths


def _save(fig, name: str) -> str:
    path = os.path.join(C.RESULTS, name)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-spark", action="store_true",
                    help="use the reference Spark costs, start no session")
    ap.add_argument("--quick", action="store_true", help="the largest two core counts only")
    args = ap.parse_args(argv)
    print(C.header("the paper's experiments simulated past this machine"))
    t0 = time.perf_counter()
    here, nets, sgemm = measure_nets(not args.no_spark)
    print(f"measured (load {C.load1():.1f}, sgemm {sgemm:.0f} GFLOP/s): "
          + ("SparkCosts.measure on local[2]: " if not args.no_spark
             else "reference Spark costs (assumed): ")
          + ", ".join(f"{k}={v:.4g}" for k, v in dataclasses.asdict(here).items()
                      if isinstance(v, float)))
    for k, n in nets.items():
        print(f"  {k}: {n.sample_s * 1e6:.1f} us/sample on one core (batch {n.batch_size}), "
              f"{n.param_bytes / 2**20:.2f} MiB of parameters")
    print(f"assumed: hosts of {CORES_PER_HOST} cores, 1 Gb/s Ethernet assumed, 0.2 ms latency, "
          f"tasks on cores of their own (task_speed 1), {HOST_MEMORY >> 30} GiB per host, "
          f"{STRAGGLERS.describe()}")
    sources = ({"reference (assumed)": here} if args.no_spark else
               {"measured here": here, "reference": cost.REFERENCE})
    everything = []
    for label, costs in sources.items():
        part = data_sweep(costs, nets, args.quick) + model_sweep(costs, nets, args.quick) + \
            lstm_sweep(costs, nets, args.quick)
        for r in part:
            r["costs"] = label
        everything += part
        note = (f" (load {C.load1():.1f})" if label.startswith("measured")
                else " (cost.REFERENCE: the reference machine, idle)")
        print("\n".join(paper_table(part, label + note)))
    rows = [r for r in everything if r["costs"] == next(iter(sources))]
    os.makedirs(C.RESULTS, exist_ok=True)
    path = os.path.join(C.RESULTS, NAME + ".csv")
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(everything[0]))
        w.writeheader()
        w.writerows(everything)
    sc88, _ = cluster(88, here)
    print("the planner on the paper's cluster, CNN, 5M samples (closed-form ranking):")
    plan, _ = best_plan(nets["cnn"], sc88, 5_000_000, 88, ["gradient", "average", "async"])
    print(plan.explain())
    cnn = [r for r in rows
           if r["figure"] == "data" and r["net"] == "cnn" and r["samples"] == 5_000_000
           and r["cores"] == 88 and r["scale"].startswith("paper")]
    if cnn:
        print(f"CNN, 5M samples, 88 cores: {100 * cnn[0]['efficiency']:.0f}% parallel efficiency "
              f"(target >= 50%; the paper: 12.5%)")
    for scale in SCALES:
        largest = [r for r in rows if r["figure"] == "data" and r["scale"] == scale
                   and r["cores"] == SCALES[scale][-1]]
        print(f"{scale}: " + "; ".join(f"{r['net']} {r['samples'] / 1e6:g}M x{r['speedup']:.0f} "
                                       f"on {r['cores']}" for r in largest))
    print(f"wrote {path}; " + ", ".join(plot(rows)) + f" ({time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
