"""Cross-references to re-exported names resolve to where the object is documented.

``sparknet.cluster.DataParallelTrainer`` is documented as
``sparknet.cluster.data_parallel.trainer.DataParallelTrainer``, ``sparknet.Sequential`` as
``sparknet.model.Sequential``.  A reference Sphinx cannot find is imported, and retried
under the defining module's name (``__module__`` and ``__qualname__``), so the short
public spellings used in prose and docstrings link instead of rendering as plain text.
"""
from __future__ import annotations

import importlib
import inspect
from typing import Any

#: module aliases the package's own imports use (``from sparknet import optim as optim_mod``)
ALIASES = {"optim_mod": "sparknet.optim", "losses_mod": "sparknet.losses"}


def canonical(target: str) -> str | None:
    """The documented dotted name of the object ``target`` names, or None."""
    parts = target.lstrip("~.").split(".")
    if parts[0] != "sparknet":
        return None
    for cut in range(len(parts), 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        owner = None
        try:
            for attr in parts[cut:]:
                owner, obj = obj, getattr(obj, attr)
        except (AttributeError, ImportError):  # ImportError: a name that needs an absent extra
            return None
        break
    else:
        return None
    if inspect.ismodule(obj):
        return obj.__name__
    if inspect.isclass(obj) or inspect.isfunction(obj):
        return f"{obj.__module__}.{obj.__qualname__}"
    if owner is not None and inspect.isclass(owner):         # a method, property or attribute
        name = canonical(f"{owner.__module__}.{owner.__qualname__}")
        return f"{name}.{parts[-1]}" if name else None
    func = getattr(obj, "__func__", None)
    if func is not None:
        return f"{func.__module__}.{func.__qualname__}"
    return None


def missing_reference(app: Any, env: Any, node: Any, contnode: Any) -> Any:
    if node.get("refdomain") != "py":
        return None
    original = node.get("reftarget", "")
    target = original.lstrip("~.")
    head, _, rest = target.partition(".")
    if head in ALIASES and rest:
        target = f"{ALIASES[head]}.{rest}"
    name = canonical(target)
    if name is None and not target.startswith("sparknet"):
        # a short name in a docstring (``ModelParallel.fit``): its own module, then the
        # packages that re-export it
        for prefix in (node.get("py:module"), "sparknet", "sparknet.cluster", "sparknet.ml"):
            if prefix and name is None:
                name = canonical(f"{prefix}.{target}")
    if not name or name == original:
        return None
    domain = env.get_domain("py")
    return domain.resolve_xref(env, node["refdoc"], app.builder, "obj", name, node, contnode)


def setup(app: Any) -> dict:
    app.connect("missing-reference", missing_reference)
    return {"parallel_read_safe": True, "version": "1"}
