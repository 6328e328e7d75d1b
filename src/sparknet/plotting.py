"""Pictures of a fit: :func:`plot_history` (``History.plot``), with matplotlib as an
optional dependency (``pip install 'sparknet[plot]'``), imported only when drawing."""
from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sparknet.history import History


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ImportError("plotting needs matplotlib: pip install 'sparknet[plot]' (or pip install "
                          "matplotlib)") from None
    if (not os.environ.get("DISPLAY")
            and matplotlib.get_backend().lower() not in ("agg", "pdf", "svg")):
        matplotlib.use("Agg")  # no screen (a cluster's driver, CI): draw to files
    import matplotlib.pyplot as plt
    return plt


def _curve(ax: Any, epochs: list[int], values: list[float], label: str, style: str) -> bool:
    pts = [(e + 1, v) for e, v in zip(epochs, values) if not math.isnan(v)]
    if not pts:
        return False
    ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=label)
    return True


def panels(history: "History") -> list[str]:
    """The panels :func:`plot_history` draws for ``history``, in order."""
    h = history.history
    out = ["loss"]
    if "accuracy" in h or "val_accuracy" in h:
        out.append("accuracy")
    if "spark_overhead" in h:
        out.append("spark")
    if any(u.get("applied") for u in getattr(history, "updates", []) or []):
        out.append("staleness")
    return out


def plot_history(history: "History", path: str | os.PathLike[str] | None = None,
                 title: str | None = None) -> Any:
    """Draw ``history`` (see :meth:`sparknet.history.History.plot`); returns the Figure.

    Raises:
        ValueError: a history with no epochs.
        ImportError: matplotlib is not installed.
    """
    if not history.epoch:
        raise ValueError("the history has no epochs to plot")
    plt = _pyplot()
    kinds = panels(history)
    fig, axes = plt.subplots(1, len(kinds), figsize=(4.2 * len(kinds), 3.4), squeeze=False)
    h, ep = history.history, history.epoch
    for ax, kind in zip(axes[0], kinds):
        if kind in ("loss", "accuracy"):
            _curve(ax, ep, h.get(kind, []), f"train {kind}", "o-")
            _curve(ax, ep, h.get(f"val_{kind}", []), f"val {kind}", "s--")
            ax.set_title(kind)
            ax.set_xlabel("epoch")
            ax.legend(fontsize=8)
        elif kind == "spark":
            _curve(ax, ep, [100.0 * v for v in h["spark_overhead"]], "Spark's share", "o-")
            ax.set_title("Spark's share of each epoch (%)")
            ax.set_xlabel("epoch")
            ax.set_ylim(bottom=0)
        else:
            stale = [int(u["staleness"]) for u in getattr(history, "updates", [])
                     if u.get("applied")]
            ax.hist(stale, bins=range(0, max(stale) + 2), align="left", rwidth=0.8)
            ax.set_title(f"staleness of {len(stale)} applied deltas")
            ax.set_xlabel("staleness (updates since launch)")
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    if path is not None:
        fig.savefig(os.fspath(path), dpi=110)
    return fig
