"""Choosing how to train: the cost model of every mode (:mod:`~sparknet.cluster.planning.cost`),
the costs it is fed (:mod:`~sparknet.cluster.planning.cost_inputs`) and the probes and flop
counts that measure them (:mod:`~sparknet.cluster.planning.probes`), memory
needs (:mod:`~sparknet.cluster.planning.memory`), the planner
(:mod:`~sparknet.cluster.planning.planner`; its candidates in
:mod:`~sparknet.cluster.planning.candidates`, its ranked result in
:mod:`~sparknet.cluster.planning.ranking`) and the cluster simulation
(:mod:`~sparknet.cluster.planning.simulate`), and the one rule that sizes a data-parallel
round (:mod:`~sparknet.cluster.planning.rounds`).
"""
