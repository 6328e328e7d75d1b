"""Damaged files on every load path: each loader checks the files it reads before using them
and raises CheckpointError naming the file that is wrong (a ModelParallel folder's block
files, manifest and driver file; checkpoints; the Spark ML Models' saved folders)."""
from __future__ import annotations

import json
import os
import re

import numpy as np
import pytest

from sparknet import Dense
from sparknet.checkpoint import CheckpointStore
from sparknet.cluster.model_parallel import ModelParallel
from sparknet.cluster.model_parallel.block_partition import BlockPlan
from sparknet.errors import CheckpointError


def _flip(path: str, where: float = 0.6) -> None:
    """Invert one byte of ``path``, ``where`` of the way in."""
    with open(path, "r+b") as fh:
        data = bytearray(fh.read())
        i = int(len(data) * where)
        data[i] ^= 0xFF
        fh.seek(0)
        fh.write(data)


def _truncate(path: str) -> None:
    with open(path, "r+b") as fh:
        fh.truncate(os.path.getsize(path) // 2)


def _named(path: str) -> str:
    return re.escape(repr(path))


@pytest.fixture
def saved_mp(tmp_path):
    """A small model-parallel model (blocks in this process), saved to ``tmp_path/saved``."""
    layers = [Dense(32, activation="relu"), Dense(16, activation="relu"), Dense(4, activation="softmax")]
    mp = ModelParallel(layers, BlockPlan({0: 2}), input_shape=(8,), spark=None, seed=0)
    X = np.random.default_rng(0).normal(size=(32, 8)).astype(np.float32)
    mp.fit(X, np.arange(32) % 4, epochs=1, batch_size=16, verbose=0)
    folder = str(tmp_path / "saved")
    mp.save(folder)
    expected = mp.predict(X)
    mp.close()
    return folder, X, expected


def _load(folder: str) -> ModelParallel:
    return ModelParallel.load(folder, spark=None)


def test_an_intact_folder_loads_and_lists_its_checksums(saved_mp):
    folder, X, expected = saved_mp
    with open(os.path.join(folder, "manifest.json")) as fh:
        files = json.load(fh)["files"]
    assert sorted(files) == ["driver.npz", "layer000_block000.npz", "layer000_block001.npz"]
    with _load(folder) as mp:
        np.testing.assert_array_equal(mp.predict(X), expected)


@pytest.mark.parametrize("damage", [_truncate, _flip], ids=["truncated", "a flipped byte"])
def test_a_damaged_block_file_is_named(saved_mp, damage):
    folder, _, _ = saved_mp
    block = os.path.join(folder, "layer000_block001.npz")
    damage(block)
    with pytest.raises(CheckpointError, match=_named(block) + " is damaged"):
        _load(folder)


def test_a_folder_without_checksums_has_its_block_files_checked_by_structure(saved_mp):
    """A folder saved before the manifest kept checksums: the zip structure and CRCs tell."""
    folder, X, expected = saved_mp
    man = os.path.join(folder, "manifest.json")
    with open(man) as fh:
        m = json.load(fh)
    del m["files"]
    with open(man, "w") as fh:
        json.dump(m, fh)
    with _load(folder) as mp:
        np.testing.assert_array_equal(mp.predict(X), expected)
    block = os.path.join(folder, "layer000_block000.npz")
    _flip(block, 0.3)  # inside the first member's data: only its CRC can tell
    with pytest.raises(CheckpointError, match=_named(block) + " is damaged"):
        _load(folder)
    _truncate(block)
    with pytest.raises(CheckpointError, match=_named(block) + r" is damaged \(BadZipFile"):
        _load(folder)


@pytest.mark.parametrize("text, why", [
    ("{not json", "is damaged: not JSON"),
    ('{"format": "sparknet-model-parallel", "version": 2}', "its 'architecture' entry is missing"),
    ('["a list"]', "is not a sparknet-model-parallel manifest"),
], ids=["garbage", "an entry missing", "not an object"])
def test_a_damaged_manifest_is_named(saved_mp, text, why):
    folder, _, _ = saved_mp
    man = os.path.join(folder, "manifest.json")
    with open(man, "w") as fh:
        fh.write(text)
    with pytest.raises(CheckpointError, match=_named(man) + ".*" + re.escape(why)):
        _load(folder)


def _replace_driver(folder: str, **arrays: np.ndarray) -> str:
    """Write ``driver.npz`` anew (pickles allowed, as a crafted file would) with its manifest
    checksum updated, so that only the file's content can refuse it."""
    from sparknet.checkpoint import sha256_file

    path = os.path.join(folder, "driver.npz")
    with np.load(path) as data:
        kept = {k: data[k] for k in data.files}
    np.savez(path, **{**kept, **arrays})
    man = os.path.join(folder, "manifest.json")
    with open(man) as fh:
        m = json.load(fh)
    size, digest = sha256_file(path)
    m["files"]["driver.npz"] = {"bytes": size, "sha256": digest}
    with open(man, "w") as fh:
        json.dump(m, fh)
    return path


def test_a_driver_file_with_object_arrays_is_refused_and_named(saved_mp):
    folder, _, _ = saved_mp
    path = _replace_driver(folder, evil=np.array([{"a": 1}, None], dtype=object))
    with pytest.raises(CheckpointError, match=_named(path) + ".*'evil' holds an object array"):
        _load(folder)


def test_a_driver_file_of_another_network_is_named(saved_mp):
    folder, _, _ = saved_mp
    with np.load(os.path.join(folder, "driver.npz")) as data:
        key = next(k for k in data.files if k.endswith(".params"))
        short = data[key][:-1].copy()
    path = _replace_driver(folder, **{key: short})
    with pytest.raises(CheckpointError, match=_named(path) + " does not fit the network of its manifest"):
        _load(folder)


def test_a_changed_driver_file_fails_its_checksum(saved_mp):
    folder, _, _ = saved_mp
    path = os.path.join(folder, "driver.npz")
    _flip(path)
    with pytest.raises(CheckpointError, match=_named(path) + ".*SHA-256 differs"):
        _load(folder)
    os.remove(path)
    with pytest.raises(CheckpointError, match=_named(path) + " is missing"):
        _load(folder)


# ------------------------------------------------------------------ checkpoints
def test_a_damaged_checkpoint_array_is_named(tmp_path):
    store = CheckpointStore(str(tmp_path / "ck"))
    ckpt = store.save(1, {"params": np.arange(10.0), "other": np.ones(3)}, {"epoch": 1})
    path = os.path.join(ckpt.path, "params.npy")
    _flip(path, 0.9)
    with pytest.raises(CheckpointError, match=re.escape(f"checkpoint {ckpt.path}: params.npy does not match")):
        store.load(ckpt)
    assert store.latest() is None  # the only checkpoint is damaged: skipped (with a warning), none left
    np.testing.assert_array_equal(store.load(ckpt, ["other"])["other"], np.ones(3))


def test_a_model_parallel_checkpoint_with_a_damaged_block_is_named(tmp_path):
    layers = [Dense(16, activation="relu"), Dense(4, activation="softmax")]
    with ModelParallel(layers, BlockPlan({0: 2}), input_shape=(8,), spark=None, seed=0,
                       checkpoint_dir=str(tmp_path / "ck")) as mp:
        folder = mp.checkpoint()
    block = next(f for f in sorted(os.listdir(folder)) if f.startswith("layer"))
    _flip(os.path.join(folder, block))
    with pytest.raises(CheckpointError, match=re.escape(f"{block} does not match its checksum")):
        _load(folder)
    with open(os.path.join(folder, "manifest.json"), "w") as fh:
        fh.write("{garbage")
    with pytest.raises(CheckpointError, match=_named(os.path.join(folder, "manifest.json")) + " is damaged"):
        _load(folder)


# ------------------------------------------------------- the Spark ML Models' folders
@pytest.mark.slow
def test_a_spark_ml_model_with_damaged_metadata_or_history_is_named(spark, tmp_path):
    from sparknet import Sequential
    from sparknet.history import History
    from sparknet.ml import SparkNetClassificationModel

    net = Sequential([Dense(10, activation="softmax")], input_shape=(4,), seed=0)
    history = History()
    history.append(0, loss=1.0)
    model = SparkNetClassificationModel.from_network(net, history=history)
    assert model.history is history
    path = str(tmp_path / "m")
    model.write().save(path)
    meta = os.path.join(path, "metadata")
    part = next(os.path.join(meta, f) for f in os.listdir(meta) if f.startswith("part-"))
    with open(part) as fh:
        doc = json.load(fh)
    doc["history"]["history"]["loss"] = "many"
    with open(part, "w") as fh:
        json.dump(doc, fh)
    for f in os.listdir(meta):
        if f.endswith(".crc"):
            os.remove(os.path.join(meta, f))
    with pytest.raises(CheckpointError, match=_named(path) + ": the training history.*'loss'"):
        SparkNetClassificationModel.load(path)
    with open(part, "w") as fh:
        fh.write("\x00garbage")
    with pytest.raises(CheckpointError, match=_named(path) + " holds no readable saved stage"):
        SparkNetClassificationModel.load(path)
