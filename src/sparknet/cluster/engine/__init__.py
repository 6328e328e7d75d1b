"""The seam between the trainers and Spark: the :class:`~sparknet.cluster.engine.base.Engine`
protocol with its Classic (:mod:`~sparknet.cluster.engine.base`) and Spark Connect
(:mod:`~sparknet.cluster.engine.connect`) implementations, and getting a session
(:mod:`~sparknet.cluster.engine.session`).
"""
