"""State held on the executors across Spark jobs: the driver side
(:mod:`~sparknet.cluster.resident.driver`), the executors' shard store
(:mod:`~sparknet.cluster.resident.shards`), its spill files
(:mod:`~sparknet.cluster.resident.spill`) and the driver's view of the executors
(:mod:`~sparknet.cluster.resident.executors`).
"""
