"""The messages of :func:`sparknet.interop._from_torch.from_torch` for what it cannot read as
given: something other than an ``nn.Sequential``, or a network whose input shape its first
module does not fix."""

from __future__ import annotations

import os
from typing import Any

from torch import nn


def where(i: int, module: nn.Module) -> str:
    """How a message names module ``i`` of the ``nn.Sequential``."""
    return f"module {i} ({type(module).__name__})"


def not_sequential(module: Any, one_module: bool) -> str:
    """What to do with ``module``, which from_torch cannot read as it is (``one_module``: a
    single module of a kind it converts)."""
    got = type(module).__name__
    head = f"from_torch takes a torch.nn.Sequential (or a module made by to_torch), got {got}"
    if isinstance(module, dict):
        return (
            f"{head}: a state_dict holds the weights, not the network; build the "
            "nn.Sequential, load_state_dict(...) into it, and pass the module"
        )
    if isinstance(module, (str, os.PathLike)):
        return (
            f"{head} {os.fspath(module)!r}: load the module first (torch.load, or build it "
            "and load_state_dict) and pass the module"
        )
    if one_module:
        return f"{head}: wrap the one module, from_torch(nn.Sequential(module), ...)"
    if isinstance(module, nn.Module):
        return (
            f"{head}, a module with its own forward(), which from_torch cannot read: write "
            "the same network as an nn.Sequential of standard modules (and copy the weights "
            "over with load_state_dict)"
        )
    return head


def input_shape_of(
    module: nn.Sequential, first: nn.Module | None, spatial: tuple[type, ...]
) -> tuple[int, ...]:
    """The per-sample shape a module that starts with an ``nn.Linear`` reads; for any other
    start (``first``: its first module that converts to a layer; ``spatial``: the
    channels-first kinds), the error saying which shape to give."""
    if isinstance(first, nn.Linear):
        return (int(first.in_features),)
    if first is None:
        raise ValueError("from_torch got an nn.Sequential with no module to convert")
    i = next(j for j, m in enumerate(module) if m is first)
    if isinstance(first, (nn.RNN, nn.LSTM, nn.GRU)):
        reads, example = "sequences (T, F)", f"(28, {first.input_size})"
    elif isinstance(first, nn.Embedding):
        reads, example = "token ids (T,)", "(100,)"
    elif isinstance(first, spatial):
        channels = getattr(first, "in_channels", getattr(first, "num_features", 1))
        two_d = isinstance(
            first,
            (
                nn.Conv2d,
                nn.MaxPool2d,
                nn.AvgPool2d,
                nn.AdaptiveAvgPool2d,
                nn.AdaptiveMaxPool2d,
                nn.BatchNorm2d,
            ),
        )
        reads, example = (
            ("images (C, H, W)", f"({channels}, 28, 28)")
            if two_d
            else ("series (C, T)", f"({channels}, 100)")
        )
    elif isinstance(first, nn.Flatten):
        after = next((m for m in list(module)[i + 1 :] if isinstance(m, nn.Linear)), None)
        flat = f"({after.in_features},)" if after is not None else "(784,)"
        reads, example = (
            "any shape and flattens it",
            f"{flat} or an image shape such as (1, 28, 28)",
        )
    else:
        reads, example = "inputs whose size it does not fix", "(64,)"
    raise ValueError(
        f"from_torch needs input_shape: {where(i, first)} reads {reads}, and the sizes cannot "
        f"be read from the module; give the per-sample shape in PyTorch's layout, e.g. "
        f"input_shape={example}"
    )
