"""Training data onto the executors: DataFrames, RDDs and packed JVM rows
(:mod:`~sparknet.cluster.data.sharding`, :mod:`~sparknet.cluster.data.packed_rows`), numpy
arrays (:mod:`~sparknet.cluster.data.numpy_input`), one fit's training and validation shards
(:mod:`~sparknet.cluster.data.fit_inputs`) and their class ids
(:mod:`~sparknet.cluster.data.labels`), the shards of cached data kept for the next fit
(:mod:`~sparknet.cluster.data.shard_cache`).
"""
