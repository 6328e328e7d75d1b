"""Checkpoints of a :class:`~sparknet.cluster.model_parallel.ModelParallel`, and restoring them.

A checkpoint is a :class:`~sparknet.checkpoint.CheckpointStore` folder
(``<checkpoint_dir>/ckpt-<step>``, manifest with a SHA-256 per file written last, the
newest ``keep`` kept) holding

* ``layerIII_blockKKK.npz``: each block's parameters and optimizer state, written by the
  executor that holds it straight into the store's staging folder (the block-file writer
  of :meth:`ModelParallel.save`), so ``checkpoint_dir`` must be a folder the executors
  and the driver both reach (local, or a shared filesystem);
* ``driver.<name>.npy``: the driver's layers, a pair's second bias and their optimizer
  state (read back with the store's checked reader);
* in the manifest's ``meta``: the architecture, the plan, the optimizer, the step count,
  every driver layer's RNG state and, for a checkpoint written by :meth:`ModelParallel.fit`,
  the fit's :class:`FitPosition` (epoch, batch, shuffle RNG state, history so far, settings).

:func:`write` refuses to write a checkpoint of non-finite weights
(:class:`~sparknet.errors.TrainingDiverged`); :func:`restore` checks the checkpoint
belongs to this network (:class:`~sparknet.errors.CheckpointError` otherwise) and
returns the fit position it holds, from which the fit replays the steps after it.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import uuid
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable

import numpy as np

from sparknet.checkpoint import FORMAT as CHECKPOINT_FORMAT
from sparknet.checkpoint import MANIFEST, Checkpoint, CheckpointStore, is_uri
from sparknet.cluster.model_parallel.backends import BlockStateLost
from sparknet.cluster.model_parallel.jobs import SaveJob
from sparknet.cluster.model_parallel.messages import SaveResult
from sparknet.cluster.model_parallel.stages import (
    BlockStage,
    DriverStage,
    PairStage,
    driver_arrays,
    set_driver_arrays,
)
from sparknet.errors import CheckpointError, TrainingDiverged

log = logging.getLogger("sparknet.cluster.model_parallel.model")

if TYPE_CHECKING:
    from sparknet.cluster.model_parallel import ModelParallel

#: ``meta["kind"]`` of a model-parallel checkpoint
KIND = "sparknet-model-parallel"
_DRIVER = "driver."


# ------------------------------------------------------------------------- fit position
@dataclass
class FitPosition:
    """Where a :meth:`ModelParallel.fit` is: all it needs to continue exactly.

    Attributes:
        fit_id: identifies the fit (a resumed fit keeps it).
        settings: the fit's ``n``, ``batch_size``, ``shuffle`` and a fingerprint of its data.
        rng: the shuffle generator's state at the start of ``epoch`` (before its permutation).
        epoch: the 0-based epoch being run; ``batch``: the next batch of it.
        done: steps this fit has run.
        tot: the epoch's running (loss sum, weight, correct).
        loss, accuracy, step_time: the history so far (per epoch, per epoch, per step).
    """

    fit_id: str
    settings: dict[str, Any]
    rng: dict[str, Any]
    epoch: int = 0
    batch: int = 0
    done: int = 0
    tot: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])
    loss: list[float] = field(default_factory=list)
    accuracy: list[float] = field(default_factory=list)
    step_time: list[float] = field(default_factory=list)

    @classmethod
    def start(cls, seed: int, settings: dict[str, Any]) -> "FitPosition":
        """A fit's first position: its shuffle generator seeded by the model's seed."""
        rng = dict(np.random.default_rng([seed, 7]).bit_generator.state)
        return cls(uuid.uuid4().hex, dict(settings), rng)

    def generator(self) -> np.random.Generator:
        """The shuffle generator in the state :attr:`rng` records."""
        g = np.random.Generator(np.random.PCG64())
        g.bit_generator.state = self.rng
        return g

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> "FitPosition":
        return cls(**d)

    def history(self) -> dict[str, Any]:
        return {"loss": list(self.loss), "accuracy": list(self.accuracy),
                "step_time": list(self.step_time)}


def data_settings(X: np.ndarray, y: np.ndarray, batch_size: int, shuffle: bool) -> dict[str, Any]:
    """What a resumed fit must share with the fit that wrote the checkpoint: the sample
    count, batch size, shuffling, and a fingerprint of the labels and of up to 1024 rows."""
    h = hashlib.sha256(np.ascontiguousarray(y).tobytes())
    h.update(np.ascontiguousarray(X[::max(1, X.shape[0] // 1024)]).tobytes())
    return {"n": int(X.shape[0]), "batch_size": int(batch_size), "shuffle": bool(shuffle),
            "data": h.hexdigest()}


def check_resumable(pos: FitPosition, settings: dict[str, Any], path: str) -> None:
    """Refuse to resume ``pos`` with other data or batches (a ``ValueError`` naming them)."""
    old = pos.settings
    for key, arg in (("n", "X"), ("batch_size", "batch_size"), ("shuffle", "shuffle"),
                     ("data", "X/y")):
        if old.get(key) != settings.get(key):
            what = "the data" if key == "data" else f"{key}={old.get(key)!r}"
            raise ValueError(f"fit(resume=True): checkpoint {path} was written by a fit with "
                             f"{what}, this call has {arg}={settings.get(key)!r}; resume with the "
                             f"same data and arguments, or pass resume=False")


# --------------------------------------------------------------------------- the store
def open_store(directory: str, keep: int) -> CheckpointStore:
    """The checkpoint store of ``directory`` (a local or shared folder: the executors write
    their block files into it themselves)."""
    if is_uri(directory):
        raise ValueError(f"checkpoint_dir={directory!r}: model-parallel checkpoints are written by "
                         "the executors themselves, so checkpoint_dir must be a folder path that "
                         "every executor and the driver reach (local or a shared filesystem "
                         "mount), not a Hadoop URI")
    return CheckpointStore(directory, keep=keep)


def _model_meta(mp: "ModelParallel") -> dict[str, Any]:
    rngs = {f"stage{j}.layer{n}": layer.rng.bit_generator.state
            for j, st in enumerate(mp.stages) if isinstance(st, DriverStage)
            for n, layer in enumerate(st.seq.layers)}
    return {"architecture": mp._architecture(), "plan": mp.plan.to_dict(), "optimizer": mp.opt_meta,
            "t": mp.t, "rng": rngs}


def _lr(mp: "ModelParallel") -> float | None:
    lr = mp.opt_meta["config"].get("lr")
    return None if lr is None else float(lr)


def save_blocks(mp: "ModelParallel", folder: str) -> int:
    """The executors stream their blocks into ``folder``; returns the bytes written.

    Raises:
        TrainingDiverged: a block holds a NaN or an infinity (nothing usable was written).
    """
    steps = tuple(mp._steps[s.index] for s in mp.blocked)
    out = mp.backend.run(SaveJob(mp.layout, tuple(mp.blocked), folder=folder, opt=mp.job_optimizer,
                                 generation=mp.generation, steps=steps))
    results = [r for r in out if isinstance(r, SaveResult)]
    bad = [name for r in results for name in r.nonfinite]
    bad += [f"driver {name}" for name, arr in driver_arrays(mp.stages).items()
            if not np.isfinite(arr).all()]
    if bad:
        lr = _lr(mp)
        more = ", ..." if len(bad) > 4 else ""
        raise TrainingDiverged(
            f"training diverged: the parameters are not finite at step {mp.t} "
            f"({', '.join(bad[:4])}{more}); nothing was written; lower the learning "
            f"rate{'' if lr is None else f' (now {lr:g})'}",
            step=mp.t, what="parameters")
    return sum(r.nbytes for r in results)


def write(mp: "ModelParallel", store: CheckpointStore, position: FitPosition | None) -> Checkpoint:
    """Write checkpoint ``mp.t`` (blocks by the executors, driver arrays, meta) atomically."""
    meta = {"kind": KIND, "model": _model_meta(mp), "fit": None if position is None
            else position.to_json()}
    with store.writing(mp.t, meta) as folder:
        save_blocks(mp, folder)
        for name, arr in driver_arrays(mp.stages).items():
            with open(os.path.join(folder, f"{_DRIVER}{name}.npy"), "wb") as fh:
                np.save(fh, np.ascontiguousarray(arr), allow_pickle=False)
                fh.flush()
                os.fsync(fh.fileno())
    ckpt = store.get(mp.t)
    if ckpt is None:  # pragma: no cover - the store just published it
        raise CheckpointError(f"checkpoint {mp.t} was written to {store.directory} but cannot be "
                              "read back")
    return ckpt


# ------------------------------------------------------------------------------ reading
def is_checkpoint(folder: str) -> bool:
    """Whether ``folder`` is a :class:`~sparknet.checkpoint.CheckpointStore` checkpoint."""
    try:
        with open(os.path.join(folder, MANIFEST), encoding="utf-8") as fh:
            return json.load(fh).get("format") == CHECKPOINT_FORMAT
    except (OSError, ValueError, AttributeError):
        return False


def open_checkpoint(path: "str | Checkpoint") -> tuple[CheckpointStore, Checkpoint]:
    """The store and the verified model-parallel checkpoint at ``path``.

    Raises:
        CheckpointError: not a checkpoint, not a model-parallel one, or damaged.
    """
    if isinstance(path, Checkpoint):
        path = path.path
    folder = os.path.abspath(os.fspath(path))
    store = CheckpointStore(os.path.dirname(folder))
    name = os.path.basename(folder)
    ckpt = next((c for c in store.checkpoints() if os.path.basename(c.path) == name), None)
    if ckpt is None:
        raise CheckpointError(f"{folder!r} is not a complete checkpoint "
                              "(no readable manifest.json)")
    if ckpt.meta.get("kind") != KIND:
        raise CheckpointError(f"checkpoint {folder!r} was not written by ModelParallel (kind "
                              f"{ckpt.meta.get('kind')!r})")
    why = store.verify(ckpt)
    if why is not None:
        raise CheckpointError(f"checkpoint {folder!r} is damaged: {why}")
    return store, ckpt


def _check_same_network(mp: "ModelParallel", model: dict[str, Any], path: str) -> None:
    def norm(v: Any) -> str:
        return json.dumps(v, sort_keys=True)
    for key, mine in (("architecture", mp._architecture()), ("plan", mp.plan.to_dict()),
                      ("optimizer", mp.opt_meta)):
        if norm(model.get(key)) != norm(mine):
            raise CheckpointError(f"checkpoint {path} holds another network: its {key} is "
                                  f"{norm(model.get(key))}, this model's is {norm(mine)}")


def set_driver_state(mp: "ModelParallel", arrays: dict[str, np.ndarray], t: int) -> None:
    """The driver's layers and optimizer state from ``arrays``, and the step count ``t``."""
    set_driver_arrays(mp.stages, arrays)
    mp.t = int(t)
    # the executors' step records restart at 0 under the model's new generation
    mp._steps = {s.index: 0 for s in mp.blocked}


def reload_blocks(mp: "ModelParallel", folder: str) -> None:
    """New resident blocks (of a new generation) streamed from the block files in ``folder``."""
    mp.backend.close()
    mp.generation = int(np.random.default_rng().integers(1, 2**62))
    mp.backend = mp._new_backend()
    mp._init_blocks(folder)
    for st in mp.stages:
        if isinstance(st, (BlockStage, PairStage)):
            st._pre = None


def restore(mp: "ModelParallel", path: "str | Checkpoint",
            blocks: bool = True) -> tuple[Checkpoint, FitPosition | None]:
    """Replace every block (unless ``blocks`` is false: they were streamed from the
    checkpoint already), driver layer, RNG state and the step count of ``mp`` by the
    checkpoint at ``path``; returns it and the fit position it holds (``None`` for a
    checkpoint written by :meth:`ModelParallel.checkpoint`)."""
    store, ckpt = open_checkpoint(path)
    model = ckpt.meta["model"]
    _check_same_network(mp, model, ckpt.path)
    names = [n for n in ckpt.arrays if n.startswith(_DRIVER)]
    driver = {n[len(_DRIVER):]: a for n, a in store.load(ckpt, names).items()}
    if blocks:
        reload_blocks(mp, ckpt.path)
    set_driver_state(mp, driver, int(model["t"]))
    for j, st in enumerate(mp.stages):
        if isinstance(st, DriverStage):
            for n, layer in enumerate(st.seq.layers):
                state = model.get("rng", {}).get(f"stage{j}.layer{n}")
                if state is not None:
                    layer.rng.bit_generator.state = state
    fit = ckpt.meta.get("fit")
    return ckpt, None if fit is None else FitPosition.from_json(fit)


def guarded(mp: "ModelParallel", fn: Callable[[], Any]) -> Any:
    """Run a step; when a block's state is lost, restore the newest checkpoint and redo
    the step (:meth:`ModelParallel.train_on_batch` does not know the batches since the checkpoint:
    :meth:`ModelParallel.fit` replays them)."""
    try:
        return fn()
    except BlockStateLost as exc:
        ckpt = mp._checkpoint_store().latest() if mp.checkpoint_dir else None
        if ckpt is None:
            raise BlockStateLost(
                f"{exc}; no checkpoint to restore from (set checkpoint_dir and call checkpoint()), "
                f"training stopped rather than going on with missing or stale weights") from None
        lost_at = mp.t
        mp._restore(ckpt)
        mp.restores += 1
        log.warning("block state lost at step %d (%s); restored checkpoint %s (step %d) and "
                    "redoing this step; train_on_batch cannot replay the %d step(s) between them "
                    "(fit() does)", lost_at, exc,
                    ckpt.path, ckpt.step, max(lost_at - 1 - ckpt.step, 0))
        return fn()
