"""Data-parallel training: the trainer (:mod:`~sparknet.cluster.data_parallel.trainer`), the
driver side of one fit (:mod:`~sparknet.cluster.data_parallel.fit_context`), the executor
side of a round (:mod:`~sparknet.cluster.data_parallel.round_task`), the parameter server
(:mod:`~sparknet.cluster.data_parallel.parameter_server`), asynchronous rounds
(:mod:`~sparknet.cluster.data_parallel.async_mode`,
:mod:`~sparknet.cluster.data_parallel.async_threads`), the outer optimizer, divergence
guards, layer state and checkpoints.
"""
