"""The messages of :func:`sparknet.interop._from_torch.from_torch` for what it cannot read as
given: something other than an ``nn.Sequential``, or a network whose input shape its first
module does not fix."""

from __future__ import annotations

import os
from typing import Any

from torch import nn


def where(i: int | str, module: nn.Module) -> str:
    """How a message names module ``i`` of the ``nn.Sequential`` (an index), or of a traced
    module (its name in ``forward()``, e.g. ``'layer1.0.conv1'``)."""
    return f"module {i if isinstance(i, int) else repr(i)} ({type(module).__name__})"


def not_sequential(module: Any, one_module: bool) -> str:
    """What to do with ``module``, which from_torch cannot read as it is (``one_module``: a
    single module of a kind it converts)."""
    got = type(module).__name__
    head = (
        "from_torch takes a torch.nn.Module (an nn.Sequential, a module with its own "
        f"forward(), or one made by to_torch), got {got}"
    )
    if isinstance(module, dict):
        return (
            f"{head}: a state_dict holds the weights, not the network; build the "
            "module, load_state_dict(...) into it, and pass the module"
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
            f"{head}, which is not a network sparknet reads by itself: pass the "
            "nn.Sequential or the module whose forward() uses it"
        )
    return head


def input_shape_of(
    named: list[tuple[int | str, nn.Module]], first: nn.Module | None, spatial: tuple[type, ...]
) -> tuple[int, ...]:
    """The per-sample shape a network that starts with an ``nn.Linear`` reads; for any other
    start, the error saying which shape to give.

    Args:
        named: the network's modules in order, each with the name a message gives it.
        first: the first of them that converts to a layer.
        spatial: the channels-first kinds.
    """
    if isinstance(first, nn.Linear):
        return (int(first.in_features),)
    if first is None:
        raise ValueError("from_torch got a network with no module to convert")
    at = next(j for j, (_, m) in enumerate(named) if m is first)
    i = named[at][0]
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
                nn.ZeroPad2d,
                nn.ConstantPad2d,
            ),
        )
        reads, example = (
            ("images (C, H, W)", f"({channels}, 28, 28)")
            if two_d
            else ("series (C, T)", f"({channels}, 100)")
        )
    elif isinstance(first, nn.Flatten):
        after = next((m for _, m in named[at + 1 :] if isinstance(m, nn.Linear)), None)
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
