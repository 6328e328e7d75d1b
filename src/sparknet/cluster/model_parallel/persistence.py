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
from sparknet.cluster.blocks import BlockPlan
from sparknet.cluster.model_parallel import files, recovery
from sparknet.cluster.model_parallel.stages import driver_arrays

if TYPE_CHECKING:
    from sparknet.cluster.model_parallel.model import ModelParallel



def save(mp: "ModelParallel", folder: str) -> str:
    """:meth:`ModelParallel.save`: blocks by the executors, then ``driver.npz`` and
    ``manifest.json``, all in a staging folder that replaces ``folder`` once complete."""
    with files.staged_folder(folder) as (final, staging):
        recovery.save_blocks(mp, staging)
        files.write_driver(staging, driver_arrays(mp.stages))
        files.write_manifest(staging, {"architecture": mp._architecture(), "plan": mp.plan.to_dict(),
                                       "optimizer": mp.opt_meta, "t": mp.t,
                                       "steps": {str(k): v for k, v in mp._steps.items()}})
    return final


def load(cls: "type[ModelParallel]", folder: str, **options: Any) -> "ModelParallel":
    """:meth:`ModelParallel.load`: a model rebuilt from a :func:`save` folder or a
    checkpoint, its blocks streamed from their files by the executors; ``options`` are
    the constructor's ``spark``, ``checkpoint_dir``, ``name``, ``replicas``... ."""
    from sparknet.model import layers_from_config

    folder = os.path.abspath(os.fspath(folder))
    ckpt = recovery.is_checkpoint(folder)
    m = recovery.open_checkpoint(folder)[1].meta["model"] if ckpt else files.read_manifest(folder)
    arch = m["architecture"]
    opt = optim_mod.from_config(m["optimizer"]["name"], m["optimizer"]["config"])
    mp = cls(layers_from_config(arch["layers"]), BlockPlan.from_dict(m["plan"]), arch["input_shape"],
             dtype=arch["dtype"], seed=arch["seed"], optimizer=opt, loss=arch.get("loss"), _load=folder, **options)
    try:
        if ckpt:
            recovery.restore(mp, folder, blocks=False)
        else:
            recovery.set_driver_state(mp, files.read_driver(folder, int(m["version"])), int(m["t"]))
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
    recovery.reload_blocks(mp, folder)
    recovery.set_driver_state(mp, files.read_driver(folder, int(m["version"])), int(m["t"]))
