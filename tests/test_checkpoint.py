"""sparknet.checkpoint: atomic checkpoint folders, verified reads, pruning, Hadoop URIs."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import tracemalloc

import numpy as np
import pytest

from sparknet.checkpoint import MANIFEST, CheckpointStore, read_npy
from sparknet.errors import CheckpointError


def _arrays(i: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(i)
    return {"params": rng.standard_normal(1000), "opt_t": np.array([i], dtype=np.int64),
            "rng": rng.integers(0, 2**32, size=4, dtype=np.uint64)}


def test_save_load_round_trip_and_keep(tmp_path):
    store = CheckpointStore(tmp_path, keep=3)
    for step in (5, 10, 15, 20, 25):
        store.save(step, _arrays(step), {"epoch": step // 5, "history": {"loss": [1.0, 0.5]}})
    names = sorted(n for n in os.listdir(tmp_path) if not n.startswith("."))
    assert names == [CheckpointStore.name(s) for s in (15, 20, 25)]
    latest = store.latest()
    assert latest is not None and latest.step == 25 and latest.meta["epoch"] == 5
    assert latest.arrays == ["opt_t", "params", "rng"]
    got = store.load(latest)
    for k, v in _arrays(25).items():
        assert got[k].dtype == v.dtype and np.array_equal(got[k], v)
    assert [c.step for c in store.checkpoints()] == [15, 20, 25]
    assert store.load(latest, ["opt_t"]).keys() == {"opt_t"}
    with pytest.raises(CheckpointError, match="no array 'nope'"):
        store.load(latest, ["nope"])


def test_damaged_newest_is_skipped_with_a_warning(tmp_path, caplog):
    store = CheckpointStore(tmp_path, keep=3)
    store.save(1, _arrays(1), {})
    newest = store.save(2, _arrays(2), {})
    path = os.path.join(newest.path, "params.npy")
    with open(path, "r+b") as fh:  # flip one byte of the data: same size, other checksum
        fh.seek(-1, os.SEEK_END)
        last = fh.read(1)
        fh.seek(-1, os.SEEK_END)
        fh.write(bytes([last[0] ^ 0xFF]))
    assert store.verify(newest) == "params.npy does not match its checksum"
    with caplog.at_level(logging.WARNING, logger="sparknet.checkpoint"):
        latest = store.latest()
    assert latest is not None and latest.step == 1
    assert "damaged" in caplog.text and CheckpointStore.name(2) in caplog.text
    with pytest.raises(CheckpointError, match="does not match its manifest"):
        store.load(newest)


def test_folder_without_manifest_is_incomplete(tmp_path, caplog):
    store = CheckpointStore(tmp_path)
    store.save(1, _arrays(1), {})
    partial = tmp_path / CheckpointStore.name(2)
    partial.mkdir()
    np.save(partial / "params.npy", np.zeros(3))
    with caplog.at_level(logging.WARNING, logger="sparknet.checkpoint"):
        assert store.latest().step == 1
    assert "incomplete" in caplog.text


def test_a_writer_killed_mid_write_publishes_nothing(tmp_path):
    """A real process killed (SIGKILL) while writing a checkpoint leaves only its staging
    folder, which the next write removes; the older checkpoint stays the newest."""
    store = CheckpointStore(tmp_path, keep=3)
    store.save(1, _arrays(1), {"epoch": 1})
    code = f"""
import os, signal, numpy as np
from sparknet.checkpoint import CheckpointStore
store = CheckpointStore({str(tmp_path)!r})
with store.writing(2, {{"epoch": 2}}) as folder:
    np.save(os.path.join(folder, "params.npy"), np.ones(10))
    os.kill(os.getpid(), signal.SIGKILL)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    left = [n for n in os.listdir(tmp_path) if n.startswith(".tmp-ckpt-")]
    assert len(left) == 1
    assert store.latest().step == 1
    store.save(3, _arrays(3), {})
    assert not [n for n in os.listdir(tmp_path) if n.startswith(".tmp-ckpt-")]
    assert [c.step for c in store.checkpoints()] == [1, 3]


def test_failed_write_leaves_nothing(tmp_path):
    store = CheckpointStore(tmp_path)
    with pytest.raises(TypeError):
        store.save(1, {"params": np.zeros(3)}, {"bad": object()})
    with pytest.raises(CheckpointError, match="object array"):
        store.save(1, {"params": np.array([object()], dtype=object)}, {})
    with pytest.raises(CheckpointError, match="array name"):
        store.save(1, {"../escape": np.zeros(3)}, {})
    assert store.latest() is None
    assert [n for n in os.listdir(tmp_path)] == []


def test_declared_size_checked_before_allocating(tmp_path):
    """An .npy header declaring 4 GiB over a few bytes of data is refused without
    allocating anything near that."""
    path = tmp_path / "huge.npy"
    with open(path, "wb") as fh:
        np.lib.format.write_array_header_1_0(fh, {"descr": "<f8", "fortran_order": False, "shape": (1 << 29,)})
        fh.write(b"\0" * 64)
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match=r"declares shape \(536870912,\)"):
            read_npy(str(path))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 16 << 20
    obj = tmp_path / "obj.npy"
    np.save(obj, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    with pytest.raises(CheckpointError, match="Python objects"):
        read_npy(str(obj))
    with open(tmp_path / "junk.npy", "wb") as fh:
        fh.write(b"not an npy file at all")
    with pytest.raises(CheckpointError, match="not a valid .npy"):
        read_npy(str(tmp_path / "junk.npy"))


def test_tampered_manifest_sizes_refused(tmp_path):
    store = CheckpointStore(tmp_path)
    ckpt = store.save(7, _arrays(7), {})
    mpath = os.path.join(ckpt.path, MANIFEST)
    m = json.load(open(mpath))
    m["files"]["params.npy"]["bytes"] += 8
    json.dump(m, open(mpath, "w"))
    assert store.latest() is None
    with pytest.raises(CheckpointError):
        store.load(store.get(7))


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="keep must be a positive integer"):
        CheckpointStore(tmp_path, keep=0)
    with pytest.raises(ValueError, match="non-empty path"):
        CheckpointStore("")


def test_hadoop_uri_through_the_session(spark, tmp_path):
    """A ``file://`` URI goes through Hadoop's FileSystem of the live session (the code
    path of hdfs:// and s3a://)."""
    uri = f"file://{tmp_path}/ckpts"
    store = CheckpointStore(uri, keep=2, spark=spark)
    for step in (1, 2, 3):
        store.save(step, _arrays(step), {"step": step})
    assert sorted(n for n in os.listdir(tmp_path / "ckpts") if n.startswith("ckpt-")) == \
        [CheckpointStore.name(2), CheckpointStore.name(3)]
    latest = store.latest()
    assert latest is not None and latest.step == 3 and latest.path.startswith("file://")
    got = store.load(latest)
    assert np.array_equal(got["params"], _arrays(3)["params"])
