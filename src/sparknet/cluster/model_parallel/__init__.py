"""Model parallelism by neuron blocks: the paper's distributed backpropagation.

A dense layer too large for one machine is cut into ``K`` blocks of neurons (see
:mod:`sparknet.cluster.model_parallel.block_partition`); block ``k`` of every blocked layer lives on
executor
*slot* ``k``, resident across Spark jobs (weights *and* optimizer state), and only
activations and deltas cross the network:

* **forward** of a blocked layer: the driver broadcasts the layer's input ``A``
  (batch x in); slot ``k`` computes its neurons ``A_k = f(A W_k^T + b_k)`` with the
  fused :mod:`sparknet._dense` kernel, keeps ``A`` and ``A_k`` for its backward, and the
  driver gathers ``[A_1 ... A_K]``;
* **backward**: the driver broadcasts the output delta; slot ``k`` computes
  ``dW_k`` and ``db_k``, **updates its own weights and optimizer state in place**
  (the optimizer's functional step, :meth:`sparknet.optim.Optimizer.apply`), and returns
  its share ``dZ_k W_k`` of the input delta, which the driver sums.  ``dW_k`` is produced
  and applied in row chunks, so a block never needs a gradient buffer of its own size.
* **paired layers** (Megatron-style): the first layer of a pair is cut by output
  neurons, the second by input neurons; slot ``k`` computes ``H_k = f(A W1_k^T + b1_k)``
  and the partial product ``H_k W2_k^T``; the driver sums the partials and adds the
  second bias.  The pair costs one exchange each way instead of two.
* **lookahead**: when the model starts with a blocked layer or pair and the next
  batch is known (:meth:`ModelParallel.fit`, or ``train_on_batch(..., next_x=...)``),
  the first stage's backward job also runs its forward pass for the next batch, with
  the weights it has just updated: a model made of one pair and driver layers needs
  **one** Spark job per step.

Unblocked layers (conv, recurrent, small dense, normalisation, residual blocks...) run
on the driver between the blocked ones, in :class:`~sparknet.model.Sequential` segments.
The result equals single-process backpropagation up to float rounding.  Layers that keep
untrained state (BatchNormalization's running statistics) keep it there, on the driver
stage: saved, checkpointed and restored with that stage's parameters.

Hybrid data x model parallelism (``replicas=D``)
------------------------------------------------
``ModelParallel(..., replicas=D)`` keeps ``D`` replicas of the ``K`` blocks on ``D * K``
slots (slot ``r * K + k`` holds block ``k`` of replica ``r``, initialised from the same
seed, so the replicas start equal).  Each step the driver cuts the batch into ``D`` row
shards: slot ``(r, k)`` runs its block on shard ``r`` (the driver assembles the full-batch
activation; driver layers run on the whole batch), gets the rows ``r`` of the output delta
(of the loss's mean over the whole batch), returns its share of the input delta and keeps
its **partial** weight gradient resident.  The partials of each block are then combined
**through the driver, in bounded pieces**: the driver collects row chunks of the partials
from the ``D`` replicas (at most ``combine_bytes`` per piece), sums them and broadcasts the
sum back, and every replica of the block applies it to those rows
(:meth:`~sparknet.optim.Optimizer.apply`; RMSprop and SGD are elementwise, so a row-chunked
step equals the whole).  The replicas stay identical and the maths is one step on the
combined batch.  The apply of piece ``i`` and the collection of piece ``i + 1`` share a
job, and the first piece rides in the backward job.

Cost per step, for ``S`` blocked stages, stage ``s`` holding ``L_s`` bytes of blocked
weights (one replica) combined in ``P_s`` pieces (a small net has ``P_s = 1``):

* **Spark jobs**: a forward and a backward job per stage as with one replica, plus one
  apply job per piece, the last of which rides in the next stage's backward job:
  ``S + 1 + sum(P_s)`` (one fewer with lookahead, where the next batch's forward of the
  first stage rides in the last job of its combine, after the weights have changed);
* **bytes through the driver**: ``D * L_s`` collected (every replica's partials) and
  ``L_s`` broadcast (the sums), counted as ``last_step_bytes["combined"]``; about
  ``2 * D * L_s`` cross the network for the gradients to reach the driver and each
  block's sum its ``D`` replicas (one broadcast per job carries every block's sums, so an
  executor fetches all of them, not only its block's);
* **driver memory**: about two pieces of gradient at a time (``combine_bytes`` collected,
  plus the sum it sends), never a whole blocked layer.

Per step the trainer counts the bytes it broadcasts and collects
(:attr:`ModelParallel.last_step_bytes`): with one replica they grow with batch x layer
width, never with the blocked weights, which do not move during training.

Where the blocks live
---------------------
Blocks are kept by :class:`sparknet.cluster.resident.driver.Resident`: a persisted anchor
RDD with one partition per slot (which pins slot -> executor), the arrays held
memory-mapped from ``.npy`` files in ``/dev/shm`` (or the executor's local
directory), so every Python worker of the host sees the same bytes and in-place
updates survive worker restarts.  Weights are initialised *on the executors* from a
seed per block (``default_rng([seed, layer, k])``), written straight into the
mapped files: the driver never holds a blocked layer.  Every block carries a
``[generation, step, busy]`` record; a job checks it, so a block that went missing
or stale (its worker or files were lost, a task was retried after a partial update)
stops training with :class:`BlockStateLost` -- or, when checkpoints exist, training
restores the newest checkpoint and carries on from there.  Nothing ever trains on
with missing or stale weights.

Checkpoints and recovery
------------------------
``ModelParallel(..., checkpoint_dir=d, checkpoint_keep=3)`` and
``fit(..., checkpoint_every=N)`` write :class:`~sparknet.checkpoint.CheckpointStore`
checkpoints (the executors write their block files into the store's staging folder, the
manifest with a SHA-256 per file comes last, the newest ``keep`` are kept) at the fit's
start and every ``N`` steps: blocks with their optimizer state, driver layers with
theirs, RNG states, the step count and the fit's position in its data order and history.
When a block's state is lost mid-fit (its executor died, its files went), the fit
restores the newest checkpoint and *replays* the minibatches since it, so it runs exactly
the steps asked for and ends with the weights of an undisturbed fit;
``fit(..., resume=True)`` continues the same way after the driver itself was lost.  A
loss, delta or updated block that is not finite raises
:class:`~sparknet.errors.TrainingDiverged` naming the step; the model keeps the weights
of the step before (restored from the checkpoints when the step had already changed
them) and no checkpoint of the diverged state is written.  ``job_timeout`` cancels a
block job that hangs (:class:`~sparknet.errors.RoundTimeout`).

The package: :mod:`~.executor` (slot store, block maths), :mod:`~.files` (block files,
manifest), :mod:`~.jobs` (typed block jobs), :mod:`~.messages` (their inputs and replies),
:mod:`~.backends` (in-process and Spark), :mod:`~.stages` (driver, blocked and pair stages,
reaching the model through :class:`~.stage_protocols.StageOwner`), :mod:`~.model` (this class),
:mod:`~.arguments` (its arguments checked), :mod:`~.inference` (output, loss, whole layers
gathered), :mod:`~.fitting` (the fit loop, resume and replay), :mod:`~.recovery` (checkpoints),
:mod:`~.persistence` (save, load, restore).

Example::

    from sparknet import Dense
    from sparknet.cluster.model_parallel.block_partition import BlockPlan
    from sparknet.cluster.model_parallel import ModelParallel

    mp = ModelParallel([Dense(16384, activation="relu"), Dense(16384, activation="relu"),
                        Dense(10, activation="softmax")],
                       BlockPlan({0: 2, 1: 2}, pair=True), input_shape=(4096,), spark=spark)
    mp.fit(X, y, epochs=1, batch_size=256)
    mp.last_step_bytes     # {'broadcast': ..., 'collected': ..., 'jobs': ..., ...}
    mp.save("model-dir")   # streamed block by block, by the executors
    mp.close()
"""
from __future__ import annotations

from sparknet.cluster.model_parallel.backends import (
           BlockMemoryError,
           BlockStateLost,
           LocalBlocks,
           SparkBlocks,
)
from sparknet.cluster.model_parallel.block_partition import BlockedLayer, BlockPlan
from sparknet.cluster.model_parallel.executor import MEMORY_TAG, vm_size
from sparknet.cluster.model_parallel.files import FORMAT, VERSION
from sparknet.cluster.model_parallel.jobs import Layout
from sparknet.cluster.model_parallel.model import DEFAULT_COMBINE_BYTES, ModelParallel
from sparknet.cluster.model_parallel.stages import Stage

__all__ = ["ModelParallel", "BlockPlan", "BlockedLayer", "BlockStateLost", "BlockMemoryError",
           "LocalBlocks", "SparkBlocks", "Layout", "Stage", "FORMAT", "VERSION", "MEMORY_TAG",
           "DEFAULT_COMBINE_BYTES", "vm_size"]
