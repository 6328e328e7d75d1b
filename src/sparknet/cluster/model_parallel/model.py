""":class:`ModelParallel`: the driver of a network whose large dense layers live in blocks
on executors (see the package docstring for how it works)."""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Sequence

import numpy as np

from sparknet import losses as losses_mod
from sparknet import optim as optim_mod
from sparknet import precision as precision_mod
from sparknet._validation import positive_int
from sparknet.activations import is_softmax_head
from sparknet.checkpoint import Checkpoint, CheckpointStore
from sparknet.cluster.engine.sizes import nbytes
from sparknet.cluster.model_parallel import arguments, inference, persistence, recovery, stages
from sparknet.cluster.model_parallel.backends import Backend, LocalBlocks, SparkBlocks
from sparknet.cluster.model_parallel.block_partition import BlockedLayer, BlockPlan
from sparknet.cluster.model_parallel.jobs import (
    BlockJob,
    ChainJob,
    InitJob,
    Layout,
    Piece,
    StatusJob,
    plan_pieces,
    shard_rows,
    with_precision,
)
from sparknet.cluster.model_parallel.messages import JobInputs, SlotStatus
from sparknet.cluster.model_parallel.stages import (
    BlockStage,
    HalfStep,
    NonFinite,
    PairStage,
    Stage,
    build_stages,
    check_finite,
)
from sparknet.errors import TrainingDiverged
from sparknet.layers.base import Layer
from sparknet.losses import Loss
from sparknet.optim import Optimizer

log = logging.getLogger(__name__)


#: bytes of replicas' partial gradients the driver collects per piece when combining them
DEFAULT_COMBINE_BYTES = 32 << 20


class ModelParallel:
    """A layer stack whose large dense layers are cut into neuron blocks living on executors.

    Args:
        layers: the model's layers (a list, or an *unbuilt*
            :class:`~sparknet.model.Sequential` whose layers, dtype, seed and loss are used).
        plan: a :class:`~sparknet.cluster.model_parallel.block_partition.BlockPlan`, a
            ``{layer_index: K}`` dict, or ``"auto"`` (the planner's K and pairing for ``spark``'s
            cluster: :func:`~sparknet.cluster.planning.planner.auto_blocks`).
        input_shape: per-sample input shape.
        spark: a ``SparkSession`` or ``SparkContext``; ``None`` runs the blocks in this
            process (:class:`LocalBlocks`, the reference).
        dtype: ``"float32"`` (default) or ``"float64"``.
        seed: seeds every initialisation (driver layers as in ``Sequential``, block ``k``
            of layer ``i`` from ``default_rng([seed, i, k])``, in every replica).
        optimizer: any :mod:`sparknet.optim` optimizer (or its name); default RMSprop.
            Blocks keep their own share of its state; with ``clipnorm`` the norm spans
            every block and driver layer (one more Spark job per step, one gradient
            buffer per block).
        loss: ``"cross_entropy"``, ``"mse"`` or a Loss; default as ``Sequential``.
        checkpoint_dir: folder of checkpoints (:meth:`checkpoint`, ``fit(checkpoint_every=N)``;
            see :mod:`~sparknet.cluster.model_parallel.recovery`), a folder the executors and
            the driver both reach; when a block's state is lost, :meth:`fit` restores the
            newest checkpoint from here and replays the steps after it.
        checkpoint_keep: how many of the newest checkpoints to keep (default 3).
        job_timeout: on Spark, seconds a block job may run before it is cancelled with
            :class:`~sparknet.errors.RoundTimeout` (a hung task); ``None`` (default): no limit.
        name: a readable prefix of the executors' resident state.
        replicas: ``D`` data-parallel replicas of the blocks (``D * K`` slots; each step's
            batch is cut into ``D`` row shards and each block's gradient summed over its
            replicas through the driver).  Default 1.
        combine_bytes: with replicas, at most this many bytes of partial gradients are
            collected by the driver per piece of the combine (default 32 MiB).

    Raises:
        ValueError: a bad plan (see :meth:`BlockPlan.resolve`), dtype, optimizer, replicas
            or combine_bytes.
        BlockMemoryError: a block does not fit its executor's Python memory limit.
    """

    def __init__(self, layers: Any, plan: "BlockPlan | dict", input_shape: Sequence[int],
                 spark: Any = None, dtype: Any = "float32", seed: int = 0,
                 optimizer: "Optimizer | str | None" = None,
                 loss: "Loss | str | None" = None, checkpoint_dir: str | None = None,
                 name: str = "blocks", replicas: int = 1,
                 combine_bytes: int = DEFAULT_COMBINE_BYTES,
                 checkpoint_keep: int = 3, job_timeout: float | None = None,
                 _load: str | None = None) -> None:
        layers, dtype, seed, loss = arguments.unwrap_layers(layers, dtype, seed, loss)
        self._set_options(layers, plan, input_shape, spark, dtype, seed, optimizer, loss,
                          checkpoint_dir, name, replicas, combine_bytes)
        self.checkpoint_keep = positive_int(checkpoint_keep, "checkpoint_keep")
        self.job_timeout = arguments.check_job_timeout(job_timeout)
        self._store = (None if checkpoint_dir is None
                       else recovery.open_store(os.fspath(checkpoint_dir), self.checkpoint_keep))
        shapes, self.output_shape = arguments.layer_shapes(layers, self.plan, self.input_shape,
                                                           self.dtype)
        self.blocked: list[BlockedLayer] = self.plan.resolve(layers, shapes, self._softmax_head)
        self.layout = Layout(self.plan.max_blocks, self.replicas)
        self.n_slots = self.layout.n_slots
        self.stages: list[Stage] = build_stages(self, shapes)
        self._reset_counters()
        self._spark = spark
        self.backend: Backend = self._new_backend()
        try:
            self._init_blocks(_load)
        except BaseException:
            self.backend.close()
            raise

    # ------------------------------------------------------------------ construction steps
    def _set_options(self, layers: list[Layer], plan: Any, input_shape: Sequence[int], spark: Any,
                     dtype: Any, seed: int, optimizer: Any, loss: Any, checkpoint_dir: str | None,
                     name: str, replicas: int, combine_bytes: int) -> None:
        """Each argument checked (:mod:`~sparknet.cluster.model_parallel.arguments`) and kept."""
        self.layers = layers
        self.dtype = arguments.check_dtype(dtype)
        self.seed = int(seed)
        opt = arguments.check_optimizer(optimizer)
        self.opt_meta: dict[str, Any] = {"name": opt.name, "config": opt.get_config()}
        #: the optimizer the block jobs carry (its hyper-parameters; blocks keep their own state)
        self.job_optimizer = self.new_optimizer()
        self.plan = arguments.resolve_plan(plan, layers, input_shape, spark, replicas)
        self.input_shape = arguments.check_input_shape(input_shape)
        self.replicas = positive_int(replicas, "replicas")
        self.combine_bytes = positive_int(combine_bytes, "combine_bytes")
        self.checkpoint_dir = checkpoint_dir
        self.name = name
        self._loss = None if loss is None else losses_mod.get(loss)
        self._softmax_head = is_softmax_head(layers[-1])

    def _reset_counters(self) -> None:
        self._steps = {s.index: 0 for s in self.blocked}
        self._pieces: dict[tuple[int, ...], tuple[Piece, ...]] = {}
        self.t = 0
        self.generation = int(np.random.default_rng().integers(1, 2**62))
        #: per step: bytes broadcast, collected, moved (broadcast x readers + collected), Spark
        #: jobs, and (replicas) the gradient bytes of the combine through the driver
        self.last_step_bytes: dict[str, int] = {}
        self._bytes = {"broadcast": 0, "collected": 0, "moved": 0, "jobs": 0, "combined": 0}
        self._times = {"executor_read_s": 0.0, "executor_compute_s": 0.0}
        #: per step: the critical path's broadcast reading and block compute time (slowest slot
        #: per job)
        self.last_step_times: dict[str, float] = {}
        self.step_times: list[float] = []
        #: how many times lost blocks were restored from a checkpoint
        self.restores = 0
        self._next_raw: Any = None
        self._next_checked: np.ndarray | None = None
        #: a job deferred into the next one (job, inputs, readers), see :meth:`run_job`
        self._pending: tuple[BlockJob, JobInputs, int] | None = None

    def _new_backend(self) -> Backend:
        if self._spark is None:
            return LocalBlocks(self.n_slots)
        return SparkBlocks(self._spark, self.n_slots, name=self.name, timeout=self.job_timeout)

    def _init_blocks(self, load: str | None) -> None:
        self.backend.run(InitJob(self.layout, tuple(self.blocked), dtype=self.dtype.name,
                                 seed=self.seed, opt=self.job_optimizer, generation=self.generation,
                                 load=load))

    # -------------------------------------------------------- what the stages use
    def new_optimizer(self) -> Optimizer:
        """A fresh optimizer of this model's kind and hyper-parameters (no state)."""
        return optim_mod.from_config(self.opt_meta["name"], self.opt_meta["config"])

    def step_of(self, layer: BlockedLayer) -> int:
        return self._steps[layer.index]

    def advance(self, layer: BlockedLayer) -> None:
        self._steps[layer.index] += 1

    def shards(self, n: int) -> tuple[int, ...] | None:
        """Row offsets of the replicas' shards of a batch of ``n`` (``None``: one replica)."""
        return None if self.replicas == 1 else shard_rows(n, self.replicas)

    def pieces(self, layers: tuple[BlockedLayer, ...]) -> tuple[Piece, ...]:
        """The pieces in which a stage's gradients are combined over the replicas."""
        key = tuple(layer.index for layer in layers)
        if key not in self._pieces:
            self._pieces[key] = plan_pieces(layers, self.replicas, self.dtype.itemsize,
                                            self.combine_bytes)
        return self._pieces[key]

    def run_job(self, job: BlockJob, data: JobInputs, readers: int, defer: bool = False) -> list:
        """Run a stage's job on ``data`` and count its bytes (``readers``: slots that read the
        broadcast).

        ``defer`` keeps a job whose results nobody waits for (a combine's last apply) to
        run in front of the next job, in the same Spark job (:class:`ChainJob`);
        :meth:`_flush` runs it alone at the end of a step.
        """
        if defer:
            self._pending = (job, data, readers)
            return []
        sent, moved = nbytes(data), nbytes(data) * readers
        pending, self._pending = self._pending, None
        if pending is not None:
            first, first_data, first_readers = pending
            job = ChainJob(self.layout, (), jobs=(first, job))
            data = JobInputs(parts=(first_data, data))
            sent, moved = sent + nbytes(first_data), moved + nbytes(first_data) * first_readers
        out = self.backend.run(with_precision(job, "bf16" if precision_mod.active() else "fp32"),
                               data)
        got = nbytes(out)
        if pending is not None:
            out = [r[1] for r in out]
        self._bytes["broadcast"] += sent
        self._bytes["moved"] += moved + got
        self._bytes["collected"] += got
        self._bytes["jobs"] += 1
        self._times["executor_read_s"] += self.backend.last_read_s
        self._times["executor_compute_s"] += self.backend.last_compute_s
        return out

    def _flush(self) -> None:
        """Run a deferred job on its own."""
        if self._pending is not None:
            job, data, readers = self._pending
            self._pending = None
            self.run_job(job, data, readers)

    def count_combined(self, n: int) -> None:
        self._bytes["combined"] += int(n)

    # ------------------------------------------------------------------ properties
    @property
    def bytes_moved(self) -> dict[str, int]:
        """Totals since the model was built of what
        :attr:`last_step_bytes` counts per step: bytes broadcast, collected, moved, Spark jobs
        and the replicas' combined gradient bytes (a copy: changing it changes nothing)."""
        return dict(self._bytes)

    @property
    def loss(self) -> Loss:
        return losses_mod.or_default(self._loss, self._softmax_head)

    @property
    def n_blocked_params(self) -> int:
        """Parameters held on the executors (all blocked layers, one replica)."""
        return sum(s.n_params - (s.units if s.cut == "cols" and s.use_bias else 0)
                   for s in self.blocked)

    @property
    def exchanges_per_step(self) -> int:
        """Spark jobs per training step without lookahead: forward + backward, one per blocked
        layer or pair and direction; with replicas, plus one per piece of each stage's
        gradient combine, less the last applies that ride in the next stage's backward job
        (``S + 1 + sum(pieces)`` for ``S`` blocked stages)."""
        blocked = [st for st in self.stages if isinstance(st, (BlockStage, PairStage))]
        if self.replicas == 1:
            return 2 * len(blocked)
        return len(blocked) + 1 + sum(len(self.pieces(st.layers)) for st in blocked)

    # ------------------------------------------------------------------- training
    def forward(self, x: np.ndarray, training: bool = False) -> np.ndarray:
        """The network's output (logits for a softmax head) for a batch ``x``."""
        for st in self.stages:
            x = st.forward(x, training)
        return x

    def _train_step(self, xb: np.ndarray, yb: np.ndarray, lo: Loss,
                    next_x: np.ndarray | None = None,
                    epoch: int | None = None) -> tuple[float, float, float]:
        """One step; raises :class:`~sparknet.errors.TrainingDiverged` (step count and
        weights as before the step) when its loss or a delta is not finite."""
        from sparknet.activations import grad as act_grad
        from sparknet.activations import softmax

        before, before_t = dict(self._bytes), dict(self._times)
        t0 = time.perf_counter()
        self._pending = None              # what a failed step left deferred is not applied
        self.t += 1
        out = self.forward(xb, training=True)
        pred = softmax(out) if (self._softmax_head and not lo.is_classification) else out
        s, w, g = lo.value_and_grad(pred, yb)
        if not np.isfinite(s):
            self.t -= 1
            stages.rewind_state(self.stages)  # the running statistics as before the step
            raise TrainingDiverged.describe("loss", s, lr=self._lr(), epoch=epoch, step=self.t + 1)
        if pred is not out:
            g = act_grad("softmax", pred, g)
        try:
            for j in range(len(self.stages) - 1, -1, -1):
                check_finite(g, "delta", f"stage {j}'s output")
                dx = self.stages[j].backward(g, need_dx=j > 0, next_x=next_x if j == 0 else None)
                if j > 0:
                    assert dx is not None
                    g = dx
        except NonFinite as exc:
            # nothing updated: no step happened
            if j == len(self.stages) - 1 and exc.what != "parameters":
                self.t -= 1
                stages.rewind_state(self.stages)
                raise TrainingDiverged.describe(exc.what, f"non-finite ({exc.where})",
                                                lr=self._lr(), epoch=epoch, step=self.t
                                                + 1) from None
            lr = self._lr()
            raise HalfStep(f"training diverged: the {exc.what} of {exc.where} became non-finite in "
                           f"step {self.t}, after weights of that step were updated; lower the "
                           f"learning rate{'' if lr is None else f' (now {lr:g})'}",
                           epoch=epoch, step=self.t, what=exc.what) from None
        self._flush()
        correct = float((out.argmax(axis=-1) == yb).sum()) if lo.is_classification else float("nan")
        self.step_times.append(time.perf_counter() - t0)
        self.last_step_bytes = {k: self._bytes[k] - before[k] for k in self._bytes}
        self.last_step_times = {k: self._times[k] - before_t[k] for k in self._times}
        self.last_step_times["step_s"] = self.step_times[-1]
        return float(s), float(w), correct

    def _lr(self) -> float | None:
        lr = self.opt_meta["config"].get("lr")
        return None if lr is None else float(lr)

    def train_on_batch(self, x: Any, y: Any, next_x: Any = None) -> tuple[float, float]:
        """One optimizer step on a batch; returns ``(mean loss, accuracy)``.

        Args:
            x: the batch's inputs.
            y: its labels or targets.
            next_x: optionally the *next* step's inputs: when the model starts with a
                blocked layer (or pair), that layer's forward pass for ``next_x`` runs in
                the same Spark job as this step's backward pass (with the weights just
                updated, so the result is unchanged), saving one exchange per step.  Pass
                the same array object to the next call.  With replicas it rides in the
                first stage's last job of the gradient combine.

        Returns:
            The batch's mean loss and accuracy (NaN for regression).
        """
        lo = self.loss
        if x is not self._next_raw or self._next_checked is None:
            x = arguments.check_inputs(x, self.input_shape, self.dtype)
        else:
            x = self._next_checked
        y = arguments.check_outputs(y, x.shape[0], lo, self.output_shape, self.dtype)
        nx = None
        if next_x is not None:
            nx = arguments.check_inputs(next_x, self.input_shape, self.dtype)
            self._next_raw, self._next_checked = next_x, nx
        s, w, c = recovery.guarded(self, lambda: self._train_step(x, y, lo, nx))
        return (s / w if w else 0.0), (c / w if w else float("nan"))

    def fit(self, X: Any, y: Any = None, epochs: int = 1, batch_size: int = 256,
            shuffle: bool = True, checkpoint_every: int = 0, verbose: int = 0,
            max_steps: int | None = None, lookahead: bool = True, resume: bool = False,
            callbacks: Sequence[Any] = (), precision: str = "fp32") -> dict:
        """Minibatch training with distributed backpropagation.

        Args:
            X: inputs ``(N, *input_shape)``.
            y: class ids (cross-entropy) or targets shaped like the output (MSE).
            epochs: passes over the data.
            batch_size: samples per step (with replicas: the combined batch of all replicas).
            shuffle: reshuffle every epoch (seeded by the model's seed).
            checkpoint_every: write a checkpoint to ``checkpoint_dir`` at the fit's start and
                every this many steps (0: never); a block state lost mid-fit then restores the
                newest one and replays the steps after it (see
                :mod:`~sparknet.cluster.model_parallel.fitting`).
            verbose: 1 prints one line per epoch.
            max_steps: stop after this many steps of this fit (a resumed fit counts the
                steps run before the checkpoint).
            lookahead: run the first blocked stage's forward pass for the next batch in the
                same Spark job as its backward pass for this one (same results, one
                exchange fewer per step; with replicas, in the last job of its gradient combine).
            resume: continue the fit recorded in the newest complete checkpoint of
                ``checkpoint_dir`` (same data and arguments); with no checkpoint there, a
                fresh fit (logged).
            callbacks: :class:`sparknet.callbacks.Callback` objects or ``f(epoch, logs)``
                (``on_batch_end`` per step; the rate set on every optimizer: blocks' and driver's).
            precision: ``"fp32"`` (default) or ``"bf16"``: the blocks' and the driver layers'
                products on bfloat16 operands with float32 sums (:mod:`sparknet.precision`;
                ``train_on_batch`` inside ``sparknet.precision.autocast()`` does the same).

        Returns:
            a dict: per epoch ``loss``, ``accuracy``, ``lr``, ``time`` (restores included), then
            ``step_time``, ``bytes_per_step`` (a resumed fit's: the steps before it too).

        Raises:
            ValueError: bad input shapes, labels or arguments; a resume with other data.
            BlockStateLost: a block's state is gone and no checkpoint of this fit can restore it.
            TrainingDiverged: the loss or a delta became NaN or infinite (the model keeps the
                weights of the step before; no checkpoint of it is written).
        """
        from sparknet.cluster.model_parallel.fitting import run_fit

        return run_fit(self, X, y, epochs=epochs, batch_size=batch_size, shuffle=shuffle,
                       checkpoint_every=checkpoint_every, verbose=verbose, max_steps=max_steps,
                       lookahead=lookahead, resume=resume, callbacks=callbacks, precision=precision)

    # ----------------------------------------------------------------- inference
    def predict_output(self, X: Any, batch_size: int = 512) -> np.ndarray:
        """Network output for ``X`` (probabilities for a softmax head)."""
        X = arguments.check_inputs(X, self.input_shape, self.dtype)
        return inference.batched_output(self.forward, X, batch_size, self._softmax_head)

    def predict(self, X: Any, batch_size: int = 512) -> np.ndarray:
        """Class ids for a classifier, raw outputs otherwise."""
        out = self.predict_output(X, batch_size)
        return out.argmax(axis=-1) if self.loss.is_classification else out

    def evaluate(self, X: Any, y: Any, batch_size: int = 512) -> dict[str, float]:
        """Mean loss (and accuracy for classifiers) on ``(X, y)``."""
        lo = self.loss
        X = arguments.check_inputs(X, self.input_shape, self.dtype)
        y = arguments.check_outputs(y, X.shape[0], lo, self.output_shape, self.dtype)
        return inference.mean_loss(self.forward, lo, self._softmax_head, X, y, batch_size)

    def get_layer_weights(self, index: int, replica: int = 0) -> dict[str, np.ndarray]:
        """The whole ``kernel``/``bias`` of layer ``index``, gathered from its blocks (of one
        replica).  This assembles a blocked layer on the driver: meant for small models,
        checks and export."""
        return inference.gather_layers(self, [index], replica)[index]

    def status(self) -> list[dict]:
        """Per slot: each layer's ``[generation, step, busy]`` record, and the address space
        (``vm``) and limit of the Python worker that answered (and its ``ppid``)."""
        replies: list[SlotStatus] = self.backend.run(StatusJob(self.layout, tuple(self.blocked)))
        return [r.as_dict() for r in replies]

    def _architecture(self) -> dict:
        from sparknet.layers.base import architecture
        return architecture(self.layers, input_shape=self.input_shape, dtype=self.dtype,
                            seed=self.seed, loss=self._loss)

    def to_sequential(self) -> Any:
        """A single-process :class:`~sparknet.model.Sequential` with these weights (small models
        only)."""
        return inference.to_sequential(self, self._architecture())

    # ----------------------------------------------------------- files and checkpoints
    def save(self, folder: str) -> str:
        """Write the model, its optimizer state and step count to ``folder``.

        Each executor streams its own blocks into ``layerIII_blockKKK.npz`` files
        (params and optimizer state; with replicas, replica 0's blocks, the replicas
        being equal); the driver writes its own layers to ``driver.npz`` and
        ``manifest.json`` last.  All is written into a hidden folder beside ``folder``
        that replaces it once complete, so ``folder`` always holds a whole model, old or
        new.  On a multi-host cluster ``folder`` must be on a filesystem every executor
        and the driver can reach.  The replica count is not saved: :meth:`load` takes it.

        Returns:
            The folder path.

        Raises:
            TrainingDiverged: a parameter is not finite (nothing is written).
        """
        return persistence.save(self, folder)

    @classmethod
    def load(cls, folder: str, spark: Any = None, checkpoint_dir: str | None = None,
             name: str = "blocks", replicas: int = 1, combine_bytes: int = DEFAULT_COMBINE_BYTES,
             checkpoint_keep: int = 3) -> "ModelParallel":
        """Rebuild a model saved by :meth:`save`, or from a checkpoint folder (with
        ``replicas`` replicas, each streaming the same block files); each executor streams
        its blocks from the files."""
        return persistence.load(cls, folder, spark=spark, checkpoint_dir=checkpoint_dir, name=name,
                                replicas=replicas, combine_bytes=combine_bytes,
                                checkpoint_keep=checkpoint_keep)

    def _checkpoint_store(self) -> CheckpointStore:
        if self._store is None:
            raise ValueError("checkpoints need a checkpoint_dir (ModelParallel(..., "
                             "checkpoint_dir=...))")
        return self._store

    def _write_checkpoint(self, position: "recovery.FitPosition | None") -> Checkpoint:
        return recovery.write(self, self._checkpoint_store(), position)

    def checkpoint(self) -> str:
        """Write checkpoint ``t`` to ``checkpoint_dir`` (atomically, through
        :class:`~sparknet.checkpoint.CheckpointStore`; the newest ``checkpoint_keep`` are
        kept) and return its folder.

        Raises:
            TrainingDiverged: a parameter is not finite (no checkpoint is written).
        """
        return self._write_checkpoint(None).path

    def latest_checkpoint(self) -> str | None:
        """The newest checkpoint folder whose files match their manifest, or ``None``."""
        ckpt = None if self._store is None else self._store.latest()
        return None if ckpt is None else ckpt.path

    def restore(self, folder: "str | Checkpoint") -> None:
        """Replace every block, driver layer, RNG state and the step count by the
        checkpoint (or :meth:`save` folder) in ``folder``.

        Raises:
            CheckpointError: a damaged checkpoint, or one of another network.
        """
        persistence.restore(self, folder)

    def _restore(self,
                 ckpt: "str | Checkpoint") -> "tuple[Checkpoint, recovery.FitPosition | None]":
        return recovery.restore(self, ckpt)

    def close(self) -> None:
        """Drop the resident blocks on the executors (and their files)."""
        self.backend.close()

    def __enter__(self) -> "ModelParallel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
