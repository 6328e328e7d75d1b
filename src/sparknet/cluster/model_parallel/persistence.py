"""Saving, loading and restoring a :class:`~sparknet.cluster.model_parallel.ModelParallel`.

:func:`save` writes the model's own folder format (:mod:`~.files`, atomically);
:func:`load` and :func:`restore` read it or a checkpoint (:mod:`~.recovery`).
The model's methods of the same names call these.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from sparknet import optim as optim_mod
from sparknet.checkpoint import Checkpoint
from sparknet.cluster.model_parallel import files, recovery
from sparknet.cluster.model_parallel.block_partition import BlockPlan
from sparknet.cluster.model_parallel.stages import driver_arrays
from sparknet.errors import CheckpointError

if TYPE_CHECKING:
    from sparknet.cluster.model_parallel.model import ModelParallel



def save(mp: "ModelParallel", folder: str) -> str:
    """:meth:`ModelParallel.save`: blocks by the executors, then ``driver.npz`` and
    ``manifest.json``, all in a staging folder that replaces ``folder`` once complete."""
    with files.staged_folder(folder) as (final, staging):
        recovery.save_blocks(mp, staging)
        files.write_driver(staging, driver_arrays(mp.stages))
        files.write_manifest(staging, {"architecture": mp._architecture(),
                                       "plan": mp.plan.to_dict(), "optimizer": mp.opt_meta,
                                       "t": mp.t,
                                       "steps": {str(k): v for k, v in mp._steps.items()}})
    return final


def load(cls: "type[ModelParallel]", folder: str, **options: Any) -> "ModelParallel":
    """:meth:`ModelParallel.load`: a model rebuilt from a :func:`save` folder or a
    checkpoint, its blocks streamed from their files by the executors; ``options`` are
    the constructor's ``spark``, ``checkpoint_dir``, ``name``, ``replicas``... .  Every
    file is checked before the executors read any (:func:`files.verify_folder`, or the
    checkpoint's checksums); a damaged one raises
    :class:`~sparknet.errors.CheckpointError` naming it."""
    from sparknet.layers.base import layers_from_config

    folder = os.path.abspath(os.fspath(folder))
    ckpt = recovery.is_checkpoint(folder)
    driver = None
    if ckpt:  # every file's checksum verified by the checkpoint store
        m = recovery.open_checkpoint(folder)[1].meta["model"]
    else:
        m = files.read_manifest(folder)
        files.verify_folder(folder, m)
        driver = files.read_driver(folder, int(m["version"]))
    try:
        arch = m["architecture"]
        opt = optim_mod.from_config(m["optimizer"]["name"], m["optimizer"]["config"])
        layers, plan = layers_from_config(arch["layers"]), BlockPlan.from_dict(m["plan"])
        shape, kw = arch["input_shape"], {"dtype": arch["dtype"], "seed": arch["seed"],
                                          "loss": arch.get("loss")}
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"{folder!r}: its manifest describes no network this sparknet can "
                              f"build ({type(exc).__name__}: {exc})") from None
    mp = cls(layers, plan, shape, optimizer=opt, _load=folder, **kw, **options)
    try:
        if driver is None:
            recovery.restore(mp, folder, blocks=False)
        else:
            _set_driver(mp, folder, driver, int(m["t"]))
    except BaseException:
        mp.close()
        raise
    return mp


def restore(mp: "ModelParallel", folder: "str | Checkpoint") -> None:
    """:meth:`ModelParallel.restore`: from a checkpoint or a :func:`save` folder."""
    if isinstance(folder, Checkpoint) or recovery.is_checkpoint(os.fspath(folder)):
        recovery.restore(mp, folder)
        return
    folder = os.path.abspath(os.fspath(folder))
    m = files.read_manifest(folder)
    files.verify_folder(folder, m)
    driver = files.read_driver(folder, int(m["version"]))
    recovery.reload_blocks(mp, folder)
    _set_driver(mp, folder, driver, int(m["t"]))


def _set_driver(mp: "ModelParallel", folder: str, arrays: dict, t: int) -> None:
    """The driver's layers and optimizer state from a saved folder's ``driver.npz``."""
    try:
        recovery.set_driver_state(mp, arrays, t)
    except (KeyError, ValueError) as exc:
        raise CheckpointError(f"{os.path.join(folder, 'driver.npz')!r} does not fit the network of "
                              f"its manifest ({type(exc).__name__}: {exc})") from None
