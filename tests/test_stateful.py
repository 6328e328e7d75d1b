"""Checkpoints composed from their parts (sparknet.stateful): every stateful part gives and
takes its own state, a data-parallel checkpoint is the composition of them, and a part
that refuses its state is named."""
from __future__ import annotations

import ast
import doctest
import json
from pathlib import Path

import numpy as np
import pytest

import sparknet.stateful
from sparknet.cluster.data_parallel.checkpoints import Position
from sparknet.cluster.data_parallel.outer_optimizer import OuterOptimizer
from sparknet.cluster.data_parallel.partition_state import ARRAY_PREFIX, PartitionStates
from sparknet.history import History
from sparknet.layers import BatchNormalization, Dense
from sparknet.model import Sequential
from sparknet.optim import RMSprop
from sparknet.stateful import Part, Stateful, compose, owner, state_of

ROOT = Path(__file__).resolve().parents[1]


def _trained() -> tuple[Sequential, RMSprop]:
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((64, 6)).astype(np.float32), rng.integers(0, 3, 64)
    model = Sequential([Dense(8, activation="relu"), BatchNormalization(), Dense(3, activation="softmax")],
                       seed=1)
    opt = RMSprop(lr=0.01)
    model.fit(X, y, epochs=2, batch_size=16, optimizer=opt, verbose=0)
    return model, opt


def _through_json(arrays: dict[str, np.ndarray], meta: dict) -> tuple[dict[str, np.ndarray], dict]:
    """What a checkpoint file gives back: arrays copied, the metadata through JSON."""
    return {k: v.copy() for k, v in arrays.items()}, json.loads(json.dumps(meta))


def test_the_docstring_example_runs():
    assert doctest.testmod(sparknet.stateful).failed == 0


def test_every_part_gives_and_takes_its_own_state_through_a_checkpoint():
    model, opt = _trained()
    outer = OuterOptimizer(momentum=0.6, lr=0.8)
    outer.step(np.zeros(5), np.ones(5))
    history = History()
    history.append(0, loss=1.5, accuracy=0.25)
    history.append(1, loss=1.25, accuracy=0.5)
    pos = Position(3, 2, 17, {"wall": 1.5, "rounds": 2.0}, np.array([4.0, 2.0, 8.0, 1.0]))
    parts_state = PartitionStates({0: {"t": np.array([3])}, 7: {"square_avg": np.ones(4, np.float32)}})
    parts = [Part("model", "", model), Part("optimizer", "opt_", opt), Part("outer", "outer_", outer),
             Part("history", "history_", history), Part("position", "partial_", pos),
             Part("partitions", ARRAY_PREFIX, parts_state)]
    assert all(isinstance(p.obj, Stateful) for p in parts)
    arrays, meta = _through_json(*compose(parts))
    # the file layout: the model's arrays unprefixed, each other part's under its prefix
    assert {"params", "state", "opt_square_avg", "outer_momentum_buffer", "partial_stats",
            "part00000_t", "part00007_square_avg"} == set(arrays)
    assert owner("partial_stats", parts).name == "position" and owner("part00007_t", parts).name == "partitions"

    model2 = Sequential.from_config(model.get_config())
    opt2, outer2, history2 = RMSprop(lr=0.01), OuterOptimizer(), History()
    pos2, parts_state2 = Position(), PartitionStates()
    fresh = [Part("model", "", model2), Part("optimizer", "opt_", opt2), Part("outer", "outer_", outer2),
             Part("history", "history_", history2), Part("position", "partial_", pos2),
             Part("partitions", ARRAY_PREFIX, parts_state2)]
    for part in fresh:
        part.obj.load_state_dict(state_of(part, arrays, meta, fresh))
    np.testing.assert_array_equal(model2.params, model.params)
    np.testing.assert_array_equal(model2.state, model.state)
    assert model2.state_dict()["rng"] == model.state_dict()["rng"]   # one-process fit shuffles alike
    assert opt2.t == opt.t and np.array_equal(opt2.state["square_avg"], opt.state["square_avg"])
    assert (outer2.momentum, outer2.lr, outer2.t) == (0.6, 0.8, 1)
    assert history2.epoch == [0, 1] and history2.history == history.history
    assert (pos2.epoch, pos2.round, pos2.rounds_done, pos2.partial) == (3, 2, 17, pos.partial)
    np.testing.assert_array_equal(pos2.partial_stats, pos.partial_stats)
    assert sorted(parts_state2.states) == [0, 7] and parts_state2.states[0]["t"].tolist() == [3]

    # the restored model and optimizer go on exactly as the originals
    rng = np.random.default_rng(5)
    X, y = rng.standard_normal((32, 6)).astype(np.float32), rng.integers(0, 3, 32)
    for m, o in ((model, opt), (model2, opt2)):
        m.fit(X, y, epochs=1, batch_size=8, optimizer=o, verbose=0)
    np.testing.assert_array_equal(model2.params, model.params)


def test_a_part_refuses_a_state_that_is_not_its_own():
    model, _ = _trained()
    with pytest.raises(ValueError, match="no layer state"):
        model.load_state_dict({"params": model.params})
    with pytest.raises(ValueError, match="holds 1 NaN"):
        model.load_state_dict({"params": np.where(np.arange(model.n_params) == 3, np.nan, model.params),
                               "state": model.state})
    with pytest.raises(ValueError, match="not a partition's array"):
        PartitionStates().load_state_dict({"7_square_avg": np.ones(3)})
    with pytest.raises(ValueError, match="two parts of a checkpoint are named 'model'"):
        compose([Part("model", "", model), Part("model", "m_", model)])
    with pytest.raises(ValueError, match="'params' of part 'b' is given twice"):
        compose([Part("a", "", model), Part("b", "", model)])


def test_the_data_parallel_checkpoint_writer_reaches_into_no_part():
    """checkpoints.py composes the parts' state dicts: no ``obj._private`` read or written
    on anything but the writer itself."""
    for name in ("checkpoints.py", "partition_state.py"):
        tree = ast.parse((ROOT / "src/sparknet/cluster/data_parallel" / name).read_text())
        reach = [f"{name}:{node.lineno} .{node.attr}" for node in ast.walk(tree)
                 if isinstance(node, ast.Attribute) and node.attr.startswith("_")
                 and not node.attr.startswith("__")
                 and not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"))]
        assert reach == []
