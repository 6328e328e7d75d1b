"""The one size function (:func:`sparknet.cluster.engine.sizes.nbytes`): what the model-parallel
byte counters and Spark Connect's shipping limit measure, against sizes worked out by hand."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import pytest

from sparknet.cluster.engine import connect as engine_connect
from sparknet.cluster.engine.sizes import nbytes
from sparknet.cluster.model_parallel.messages import BackwardResult, JobInputs, SlotReply


@dataclass(frozen=True)
class _Pair:
    a: np.ndarray
    b: Optional[np.ndarray]
    label: str = "pair"


def test_arrays_tuples_and_dataclasses_weigh_their_bytes():
    x = np.zeros((3, 4))                             # 3 * 4 * 8 = 96 bytes
    h = np.zeros(10, dtype=np.float32)               # 10 * 4 = 40 bytes
    v = np.zeros((2, 5), dtype=np.float64)[:, ::2]   # a strided view: 2 * 3 * 8 = 48 bytes
    assert nbytes(x) == 96 and nbytes(h) == 40 and nbytes(v) == 48
    assert nbytes((x, h)) == 136 and nbytes([x, (h, v)]) == 184
    assert nbytes(_Pair(x, h)) == 136 and nbytes(_Pair(x, None)) == 96
    assert nbytes({"x": x, "rest": [_Pair(h, v)]}) == 184


def test_the_messages_weigh_what_their_wire_form_weighs():
    x, dy = np.ones((4, 8)), np.ones((4, 2), dtype=np.float32)   # 256 and 32 bytes
    g = (np.ones((2, 3)), np.ones(3))                            # 48 and 24 bytes
    inputs = JobInputs(x=x, parts=(JobInputs(g=g), JobInputs(dy=dy)))
    assert nbytes(inputs) == nbytes(inputs.encode()) == 256 + 48 + 24 + 32
    reply = SlotReply(BackwardResult(dx=x, ahead=None, piece=g, sumsq=1.5), ppid=7, read_s=0.5,
                      compute_s=2.0)
    assert nbytes(reply) == 256 + 48 + 24                       # numbers count nothing


def test_buffers_count_their_length_and_other_values_nothing():
    assert nbytes(b"abcde") == 5 and nbytes(bytearray(7)) == 7
    assert nbytes(memoryview(np.zeros(4))) == 32
    assert nbytes([None, 3, 2.5, "a string", {"k": True}]) == 0


def test_connect_refuses_a_closure_past_its_limit_by_the_same_size(monkeypatch):
    vec = np.zeros(128)                                          # 1024 bytes
    monkeypatch.setattr(engine_connect, "MAX_CLOSURE_BYTES", 1024)
    assert engine_connect.InClosure({"p": vec}).value["p"] is vec
    with pytest.raises(ValueError, match="Spark Connect query carries"):
        engine_connect.InClosure((vec, np.zeros(1, dtype=np.uint8)))
