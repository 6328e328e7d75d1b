"""What every benchmark prints first: the machine it ran on.

Figures from different machines differ by more than any change being measured (one-thread
sgemm ran ~205 GFLOP/s where ``README.md`` was written, ~92 on another machine of the same
kind), so each benchmark's header names the CPU model, its cache sizes and the one-thread
sgemm rate measured right then through the BLAS the kernels call (``sparknet._blas``), with
the load average (the machine is often shared), and the CPU's bfloat16/AMX flags with the
paths sparknet's products take (``sparknet.precision``)::

    from _machine import machine_header
    print(machine_header())
"""
from __future__ import annotations

import os
import platform

import numpy as np

_SYS_CACHE = "/sys/devices/system/cpu/cpu0/cache"
_rate: tuple[float, float] | None = None
_kernel_rate: float | None = None


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), or the platform's processor string."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def _size_text(size: str) -> str:
    """``48K`` -> ``48 KiB``, ``2048K`` -> ``2 MiB``."""
    s = size.strip().upper()
    unit = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(s[-1:], 1)
    try:
        n = int(s.rstrip("KMGB")) * unit
    except ValueError:
        return size.strip()
    for name, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {name}"
    return f"{n} B"


def cache_sizes() -> dict[str, str]:
    """Data and unified cache sizes seen by one core, ``{"L1d": "48 KiB", "L2": ..., "L3": ...}``
    (from ``/sys``; empty where the kernel does not expose them)."""
    out: dict[str, str] = {}
    try:
        entries = sorted(os.listdir(_SYS_CACHE))
    except OSError:
        return out
    for e in entries:
        d = os.path.join(_SYS_CACHE, e)
        try:
            with open(os.path.join(d, "level")) as f:
                level = f.read().strip()
            with open(os.path.join(d, "type")) as f:
                kind = f.read().strip()
            with open(os.path.join(d, "size")) as f:
                size = f.read()
        except OSError:
            continue
        if kind == "Instruction":
            continue
        out[f"L{level}d" if kind == "Data" else f"L{level}"] = _size_text(size)
    return out


def sgemm_gflops(n: int = 1024, repeats: int = 7) -> tuple[float, float]:
    """One-thread float32 GEMM rate, ``(best, median)`` GFLOP/s over ``repeats`` products of
    two ``n x n`` matrices, through the BLAS sparknet's kernels call.  Measured once per process."""
    global _rate
    if _rate is None:
        from sparknet.cluster.planning.probes import gemm_times

        times = gemm_times(n, repeats)
        flops = 2.0 * n ** 3
        _rate = (flops / min(times) / 1e9, flops / float(np.median(times)) / 1e9)
    return _rate


def kernel_gflops(n: int = 1024, repeats: int = 7) -> float | None:
    """One-thread rate of sparknet's own float32 product (``csrc/sgemm_avx512.h``) on two
    ``n x n`` matrices, GFLOP/s, best of ``repeats``, measured through the dense layer's
    forward (which transposes its weight for it); None where the CPU has no AVX-512.  Where
    the environment keeps OpenBLAS on narrower kernels (``OPENBLAS_CORETYPE=Haswell``), this
    is the faster of the machine's two sgemm rates.  Measured once per process."""
    global _kernel_rate
    from sparknet import _dense

    if _dense.gemm_backend() != "avx512":
        return None
    if _kernel_rate is None:
        import time

        rng = np.random.default_rng(0)
        X = rng.standard_normal((n, n)).astype(np.float32)
        W = rng.standard_normal((n, n)).astype(np.float32)
        Y = np.empty((n, n), np.float32)
        _dense.forward(X, W, None, Y)
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            _dense.forward(X, W, None, Y)
            best = min(best, time.perf_counter() - t0)
        _kernel_rate = 2.0 * n ** 3 / best / 1e9
    return _kernel_rate


def best_sgemm_gflops() -> float:
    """The faster of the BLAS' and sparknet's own one-thread sgemm rates (1024^3, best)."""
    return max(sgemm_gflops()[0], kernel_gflops() or 0.0)


def blas_banner() -> str:
    """The BLAS libraries loaded (threadpoolctl's view) and ``OPENBLAS_CORETYPE``."""
    try:
        from threadpoolctl import threadpool_info

        import sparknet._blas  # noqa: F401  (loads scipy's BLAS)
        libs = "; ".join(f"{d.get('internal_api')} {d.get('version')} [{d.get('architecture')}]"
                         for d in threadpool_info() if d.get("user_api") == "blas")
    except Exception as exc:  # pragma: no cover - a banner never stops a benchmark
        libs = f"unknown ({exc})"
    # glibc's malloc returns freed memory to the system and maps large blocks afresh, so that
    # a step's large tensors may cost page faults: PyTorch's CNN step ran 1.5-2x faster with
    # both thresholds raised (as tcmalloc or jemalloc would give it); the variable says which
    malloc = os.environ.get("GLIBC_TUNABLES", "(unset)")
    return (f"{libs}; OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', '(unset)')}; "
            f"GLIBC_TUNABLES={malloc}")


def cpu_flags(names: tuple[str, ...] = ("avx512f", "avx512_bf16", "amx_tile", "amx_bf16")
              ) -> dict[str, bool]:
    """Which of ``names`` the CPU lists in ``/proc/cpuinfo`` (all False where it is unreadable)."""
    have: set[str] = set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("flags"):
                    have = set(line.split(":", 1)[1].split())
                    break
    except OSError:
        pass
    return {n: n in have for n in names}


def precision_banner() -> str:
    """The CPU's AVX-512/bfloat16/AMX flags and the paths sparknet's products take."""
    flags = ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in cpu_flags().items())
    try:
        from sparknet.precision import describe

        paths = "; ".join(describe().splitlines())
    except Exception as exc:  # pragma: no cover - a banner never stops a benchmark
        paths = f"unknown ({exc})"
    return f"CPU flags: {flags}\nsparknet paths: {paths}"


def machine_header() -> str:
    """Lines naming the machine: CPU model, CPUs, caches, the one-thread sgemm rate now,
    the load average; then the BLAS in use; then the bfloat16/AMX flags and paths."""
    caches = cache_sizes()
    cache = ", ".join(f"{k} {v}" for k, v in caches.items()) or "cache sizes unknown"
    best, median = sgemm_gflops()
    kernel = kernel_gflops()
    own = f"; sparknet's AVX-512 kernel {kernel:.0f} best" if kernel else ""
    try:
        load = "load average " + " ".join(f"{x:.1f}" for x in os.getloadavg())
    except OSError:
        load = "load average unknown"
    return (f"machine: {cpu_model()}, {os.cpu_count()} CPUs; {cache}; "
            f"sgemm 1 thread (1024^3): BLAS {best:.0f} GFLOP/s best, {median:.0f} median{own}; "
            f"{load}\n"
            f"BLAS: {blas_banner()}\n{precision_banner()}")


if __name__ == "__main__":
    print(machine_header())


def print_rates(res: dict) -> None:
    """The table of an interleaved sparknet-against-PyTorch run: samples/s of each (median and
    best wall-clock round, CPU-time rate), their ratios and the per-round ratio range.  ``res``
    holds ``sparknet`` and ``torch`` (``wall_median``, ``wall_best``, ``cpu``), ``ratio_wall``,
    ``ratio_best``, ``ratio_cpu``, ``ratio_wall_range``, ``ratio_cpu_range`` and ``config``
    (``rounds``, ``n_steps``)."""
    c = res["config"]
    print(f"{'':<10}{'wall median':>13}{'wall best':>11}{'CPU time':>10}")
    for k in ("sparknet", "torch"):
        if res.get(k):
            r = res[k]
            print(f"{k:<10}{r['wall_median']:>13,.0f}{r['wall_best']:>11,.0f}{r['cpu']:>10,.0f}")
    if res["torch"]:
        print(f"{'ratio':<10}{res['ratio_wall']:>12.2f}x{res['ratio_best']:>10.2f}x"
              f"{res['ratio_cpu']:>9.2f}x   (sparknet / PyTorch)")
        (wl, wh), (cl, ch) = res["ratio_wall_range"], res["ratio_cpu_range"]
        print(f"per-round ratio range: wall {wl:.2f}-{wh:.2f}x, CPU time {cl:.2f}-{ch:.2f}x "
              f"({c['rounds']} alternating rounds of {c['n_steps']} steps)")
