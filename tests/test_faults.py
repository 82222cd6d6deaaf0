"""Fault injection: the bad inputs and accidents a new user meets, each pinned to its message and exit code.

Unreadable images with identical bytes, store shards overwritten or garbled, broken manifests, two
runs on one store at once, checkpoints already in the store, a garbage checkpoint in a grid, broken
bring-your-own embeddings, unwritable outputs, a store this user cannot write (shared or read-only), a full
disk, bad options, bad annotation files and job-file names, files that are no image, Ctrl-C, SIGTERM, and
kill -9 at random points of eval and mine (a short version by default; ``-m chaos`` runs the long loop).
"""
from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
import torch
from helpers import make_karpathy_world, save_random_checkpoint, write_image, write_tiny_config

from hardrank.errors import DataError
from hardrank.jobs.cli import main

N_IMAGES = 10


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults")
    w = make_karpathy_world(root, n_images=N_IMAGES)
    w["ann"] = w["annotations"] / "coco_karpathy_test.json"
    w["cfg"] = write_tiny_config(root)
    w["ckpts"] = [save_random_checkpoint(w["cfg"], root / f"epoch_{i + 1}.safetensors", i) for i in range(2)]
    return w


def _eval(world, out, store, *ckpts, images=None, ann=None, extra=(), quiet=True) -> list[str]:
    return ["eval", "--model", str(world["cfg"]), "--checkpoint", *map(str, ckpts or world["ckpts"][:1]),
            "--suite", "karpathy", "--annotations", str(ann or world["ann"]),
            "--images", str(images or world["images"]), "--out", str(out), "--store", str(store),
            "--batch-size", "4", *(["--quiet"] if quiet else []), *extra]


def _mine(world, out, store, *, images=None, ann=None, extra=(), quiet=True) -> list[str]:
    ann = str(ann or world["ann"])
    return ["mine", "--model", str(world["cfg"]), "--checkpoint", str(world["ckpts"][0]), "--corpus", ann,
            "--queries", ann, "--images", str(images or world["images"]), "--direction", "t2i", "-k", "3",
            "--out", str(out), "--store", str(store), "--batch-size", "4", *(["--quiet"] if quiet else []), *extra]


def _result(out, label="epoch_1") -> dict:
    return json.loads((Path(out) / label / "karpathy.json").read_text())


def _shard_keys(folder: Path) -> list[str]:
    keys = []
    for p in sorted(folder.glob("shard-*.arrow")):
        keys += ipc.open_file(pa.memory_map(str(p))).read_all().column("key").to_pylist()
    return keys


def _check_store(store_root: Path, killed: bool = False) -> dict[str, dict[str, int]]:
    """Every fingerprint folder: each key stored once, the manifest listing exactly the shards on disk.
    ``killed``: the state a kill -9 left, which may be cut between a shard's rename into place and the
    manifest's rewrite; the shards on disk are the truth (the next writer lists them), so the manifest
    may lack the newest one there but must never name a shard that is not on disk."""
    counts = {}
    for fp in sorted(p for p in store_root.iterdir() if p.is_dir()):
        manifest = json.loads((fp / "manifest.json").read_text())
        counts[fp.name] = {}
        for mod in ("image", "text"):
            keys = _shard_keys(fp / mod)
            assert len(keys) == len(set(keys)), f"{fp.name}/{mod}: a key is stored twice"
            listed, on_disk = set(manifest["shards"][mod]), {p.name for p in (fp / mod).glob("shard-*.arrow")}
            assert listed <= on_disk if killed else listed == on_disk, (sorted(listed), sorted(on_disk))
            counts[fp.name][mod] = len(keys)
    return counts


def test_a_manifest_cut_short_by_a_kill_lists_every_shard_once_the_store_is_opened(tmp_path):
    """kill -9 between a shard's rename into place and the manifest's rewrite leaves a shard the manifest
    lacks; the next process to open the store (even one that writes nothing) lists it again."""
    from hardrank import EmbeddingStore

    rng = np.random.default_rng(0)
    st = EmbeddingStore(tmp_path, "fp", dim=4, dtype="float32")
    st.write("text", ["a", "b"], rng.standard_normal((2, 4)))
    before = (tmp_path / "fp" / "manifest.json").read_text()
    st.write("text", ["c"], rng.standard_normal((1, 4)))
    (tmp_path / "fp" / "manifest.json").write_text(before)  # the state such a kill leaves
    assert _check_store(tmp_path, killed=True) and len(json.loads(before)["shards"]["text"]) == 1
    EmbeddingStore(tmp_path, "fp", dim=4, dtype="float32")  # opened, nothing written
    assert _check_store(tmp_path) == {"fp": {"image": 0, "text": 3}}


# -- unreadable images --------------------------------------------------------------------------
@pytest.mark.parametrize("content", [b"", b"<html>404 Not Found</html>"], ids=["zero-byte", "same-error-page"])
def test_two_unreadable_images_with_identical_bytes(world, tmp_path, content):
    images = tmp_path / "images"
    shutil.copytree(world["images"], images)
    bad = [images / world["clean"][i]["image"] for i in (0, 1)]
    for p in bad:
        p.write_bytes(content)
    assert main(_eval(world, tmp_path / "out", tmp_path / "store", images=images)) == 0
    res = _result(tmp_path / "out")
    assert res["failed_items"] == 2
    assert sorted(f["source"] for f in res["failures"]) == sorted(map(str, bad))  # both, each under its own row
    assert len({f["row"] for f in res["failures"]}) == 2
    for f in res["failures"]:
        assert "0x" not in f["reason"] and "BytesIO" not in f["reason"], f["reason"]  # the same text every run
        assert str(bad[0]) in f["reason"] or str(bad[1]) in f["reason"]
    assert res["counts"]["original"]["i2t"]["queries"] == N_IMAGES - 2
    assert main(_mine(world, tmp_path / "mined", tmp_path / "store", images=images)) == 0
    summary = json.loads((tmp_path / "mined" / "summary.json").read_text())
    assert summary["inputs"]["corpus"]["skipped"] == 2 and summary["inputs"]["embed"]["image"]["failed"] == 2
    assert summary["counts"]["corpus"] == N_IMAGES - 2


# -- the store verifies itself -------------------------------------------------------------------
def _image_shard(store: Path, fingerprint: str) -> Path:
    shards = sorted((store / fingerprint / "image").glob("shard-*.arrow"))
    assert len(shards) == 1
    return shards[0]


def test_store_shard_overwritten_with_other_valid_floats_is_detected_and_reencoded(world, tmp_path, caplog):
    store = tmp_path / "store"
    assert main(_eval(world, tmp_path / "clean", store)) == 0
    clean = _result(tmp_path / "clean")
    shard = _image_shard(store, clean["model_fingerprint"])
    emb = ipc.open_file(pa.memory_map(str(shard))).read_all().column("embedding").combine_chunks()
    emb = emb.values.to_numpy().reshape(len(emb), -1)
    data = bytearray(shard.read_bytes())
    at = data.find(emb[0].tobytes())
    assert at > 0
    data[at:at + emb[0].nbytes] = emb[1].tobytes()  # another valid, L2-normalised vector: no NaN to notice
    shard.write_bytes(bytes(data))

    with caplog.at_level(logging.WARNING, logger="hardrank.store.embedding_store"):
        assert main(_eval(world, tmp_path / "again", store)) == 0
    assert "failed its checksum" in caplog.text and str(shard) in caplog.text
    again = _result(tmp_path / "again")
    assert again["metrics"] == clean["metrics"]                     # the wrong vector was never used
    assert again["provenance"]["embed"]["image"]["encoded"] == N_IMAGES  # the shard's items were re-encoded
    quarantined = list((store / clean["model_fingerprint"] / "quarantine").iterdir())
    assert [p.name for p in quarantined] == [f"image-{shard.name}"]  # moved aside, not deleted
    _check_store(store)


@pytest.mark.parametrize("damage", ["random-bytes", "truncated"])
def test_garbled_store_shard_is_quarantined_and_reencoded(world, tmp_path, caplog, damage):
    store = tmp_path / "store"
    assert main(_eval(world, tmp_path / "clean", store)) == 0
    clean = _result(tmp_path / "clean")
    shard = sorted((store / clean["model_fingerprint"] / "text").glob("shard-*.arrow"))[0]
    data = bytearray(shard.read_bytes())
    if damage == "truncated":
        data = data[:len(data) // 2]
    else:
        data[len(data) // 3:len(data) // 3 + 256] = np.random.default_rng(0).bytes(256)
    shard.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="hardrank.store.embedding_store"):
        assert main(_eval(world, tmp_path / "again", store)) == 0
    assert "moved to" in caplog.text and "encoder output" not in caplog.text
    assert _result(tmp_path / "again")["metrics"] == clean["metrics"]
    assert (store / clean["model_fingerprint"] / "quarantine" / f"text-{shard.name}").is_file()


@pytest.mark.parametrize("manifest", ["", "{", "[]", None], ids=["empty", "truncated", "not-an-object", "deleted"])
def test_broken_manifest_is_rebuilt_from_the_shards(world, tmp_path, manifest):
    from hardrank import open_store

    store = tmp_path / "store"
    assert main(_eval(world, tmp_path / "clean", store)) == 0
    clean = _result(tmp_path / "clean")
    folder = store / clean["model_fingerprint"]
    counts = _check_store(store)
    if manifest is None:
        (folder / "manifest.json").unlink()
    else:
        (folder / "manifest.json").write_text(manifest)
    st = open_store(folder)  # a store folder given as a mining input: its shape comes from the shards
    assert (st.dim, st.count("image")) == (16, N_IMAGES)
    assert main(_eval(world, tmp_path / "again", store)) == 0
    again = _result(tmp_path / "again")
    assert again["metrics"] == clean["metrics"] and again["provenance"]["embed"]["image"]["encoded"] == 0
    assert _check_store(store) == counts  # the manifest lists every shard again


def test_store_folder_as_mining_input_is_verified(tmp_path, capsys):
    from hardrank import EmbeddingStore

    rng = np.random.default_rng(0)
    st = EmbeddingStore(tmp_path / "store", "fp", dim=8, dtype="float32")
    emb = rng.standard_normal((20, 8)).astype(np.float32)
    emb /= np.linalg.norm(emb, axis=1, keepdims=True)
    st.write("text", [f"t{i}" for i in range(10)], emb[:10])
    st.write("text", [f"t{i}" for i in range(10, 20)], emb[10:])
    folder = tmp_path / "store" / "fp"
    (folder / "manifest.json").unlink()  # shards alone make a store folder
    args = ["mine", "--corpus", str(folder), "--queries", str(folder), "--direction", "t2t", "-k", "2", "--quiet"]
    assert main([*args, "--out", str(tmp_path / "ok")]) == 0
    shard = sorted((folder / "text").glob("shard-*.arrow"))[1]
    data = bytearray(shard.read_bytes())
    at = data.find(emb[12].tobytes())
    data[at:at + 32] = emb[3].tobytes()
    shard.write_bytes(bytes(data))
    capsys.readouterr()
    assert main([*args, "--out", str(tmp_path / "bad")]) == 3
    err = capsys.readouterr().err
    assert "1 shard(s) of this store folder failed their checksum" in err and str(folder) in err
    assert shard.is_file()  # an input store folder is only read: nothing moved


def test_each_shard_is_verified_once_per_process(tmp_path, monkeypatch):
    import hardrank.store.embedding_store as store_mod
    from hardrank import EmbeddingStore

    calls = []
    digest = store_mod._digest
    monkeypatch.setattr(store_mod, "_digest", lambda keys, emb: calls.append(len(keys)) or digest(keys, emb))
    rng = np.random.default_rng(0)
    st = EmbeddingStore(tmp_path, "fp", dim=4, dtype="float32")
    st.write("text", ["a", "b"], rng.standard_normal((2, 4)))
    st.write("text", ["c"], rng.standard_normal((1, 4)))
    assert calls == [2, 1]  # writing computes each checksum once
    for _ in range(3):  # other store objects of this process trust what it verified
        st2 = EmbeddingStore(tmp_path, "fp", dim=4, dtype="float32")
        st2.read("text", ["a", "c"])
    assert calls == [2, 1]
    shard = sorted((tmp_path / "fp" / "text").glob("shard-*.arrow"))[0]
    os.utime(shard)  # a changed file is checked again, and passes
    EmbeddingStore(tmp_path, "fp", dim=4, dtype="float32").read("text", ["a", "b"])
    assert calls == [2, 1, 2]


# -- concurrent runs ----------------------------------------------------------------------------
_WRAPPER = r"""
import os, sys, time
import hardrank.encoding.job as job
import hardrank.embed.pipeline as pipeline

flush = int(os.environ.get("HR_TEST_FLUSH_ROWS", "0"))
if flush:  # commit a shard every few rows, so a kill lands between commits
    run = pipeline.EmbedPipeline.run
    pipeline.EmbedPipeline.run = lambda self, tables, **kw: run(self, tables, **{**kw, "flush_rows": flush})
gate, at = os.environ.get("HR_TEST_GATE"), int(os.environ.get("HR_TEST_GATE_AT", "1"))
if gate:  # the at-th encoder batch waits until the test creates the gate file
    call = job.EncodeStage.__call__
    seen = [0]
    def gated(self, batch):
        seen[0] += 1
        if seen[0] == at:
            print("HR-TEST encoding", file=sys.stderr, flush=True)
            while not os.path.exists(gate):
                time.sleep(0.02)
        return call(self, batch)
    job.EncodeStage.__call__ = gated
from hardrank.errors import DataError
from hardrank.jobs.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _spawn(args, log: Path, **env) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", _WRAPPER, *map(str, args)], stdout=subprocess.DEVNULL,
                            stderr=open(log, "w"), env={**os.environ, **{k: str(v) for k, v in env.items()}})


def _wait_for(log: Path, text: str, proc: subprocess.Popen, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while text not in log.read_text():
        assert proc.poll() is None, f"exited {proc.returncode} before {text!r}:\n{log.read_text()[-3000:]}"
        assert time.monotonic() < deadline, f"no {text!r} in time:\n{log.read_text()[-3000:]}"
        time.sleep(0.05)


def test_two_evals_on_one_store_at_once_encode_each_item_once(world, tmp_path):
    store, gate = tmp_path / "store", tmp_path / "gate"
    a = _spawn(_eval(world, tmp_path / "a", store, *world["ckpts"]), tmp_path / "a.log", HR_TEST_GATE=gate)
    try:
        _wait_for(tmp_path / "a.log", "HR-TEST encoding", a)  # a holds the store lock, mid-encode
        b = _spawn(_eval(world, tmp_path / "b", store, *world["ckpts"]), tmp_path / "b.log")
        try:
            _wait_for(tmp_path / "b.log", "waiting for it to finish", b)  # b is blocked on the lock
            assert f"pid {a.pid}" in (tmp_path / "b.log").read_text()
            gate.touch()
            assert a.wait(300) == 0, (tmp_path / "a.log").read_text()[-3000:]
            assert b.wait(300) == 0, (tmp_path / "b.log").read_text()[-3000:]
        finally:
            b.kill()
    finally:
        a.kill()
    for label in ("epoch_1", "epoch_2"):
        ra, rb = _result(tmp_path / "a", label), _result(tmp_path / "b", label)
        assert ra["metrics"] == rb["metrics"]
        for mod in ("image", "text"):  # what a encoded, b found in the store
            assert rb["provenance"]["embed"][mod]["encoded"] == 0
            assert ra["provenance"]["embed"][mod]["encoded"] == rb["provenance"]["embed"][mod]["from_store"] > 0
    counts = _check_store(store)  # each item stored once; every shard of the store in the manifest
    assert len(counts) == 2 and all(c["image"] == N_IMAGES for c in counts.values())


# -- K checkpoints, some already stored ------------------------------------------------------------
def test_a_checkpoint_whose_items_are_stored_is_not_encoded(world, tmp_path, capsys):
    store = tmp_path / "store"
    first, second = world["ckpts"]
    assert main(_eval(world, tmp_path / "out", store, first)) == 0
    fp1 = _result(tmp_path / "out")["model_fingerprint"]
    shards_before = sorted(p.name for p in (store / fp1).rglob("shard-*.arrow"))
    capsys.readouterr()
    assert main(_eval(world, tmp_path / "out", store, first, second, extra=("--dry-run",))) == 0
    plan = capsys.readouterr().out
    assert f"images {N_IMAGES}/{N_IMAGES}" in plan and f"images 0/{N_IMAGES}" in plan
    assert main(_eval(world, tmp_path / "out", store, first, second)) == 0
    e1 = _result(tmp_path / "out", "epoch_1")["provenance"]["embed"]
    e2 = _result(tmp_path / "out", "epoch_2")["provenance"]["embed"]
    n_text = e1["text"]["from_store"]
    assert (e1["image"]["encoded"], e1["image"]["from_store"], e1["text"]["encoded"]) == (0, N_IMAGES, 0)
    assert (e2["image"]["encoded"], e2["image"]["from_store"], e2["text"]["encoded"]) == (N_IMAGES, 0, n_text)
    assert e1["image"]["pass"] == e2["image"]["pass"] == {"checkpoints": 2, "encoded": N_IMAGES, "from_store": 0}
    assert sorted(p.name for p in (store / fp1).rglob("shard-*.arrow")) == shards_before  # epoch_1 untouched


def test_per_checkpoint_encoding_gives_the_same_vectors(world, tmp_path):
    """Checkpoint 2 encoded alone (checkpoint 1 stored) equals checkpoint 2 encoded with checkpoint 1."""
    from hardrank import EmbedOptions, EmbedPipeline
    from hardrank.items import Tables
    from hardrank.suites import SuiteOptions, load_suites

    def tables():
        t = Tables.empty()
        load_suites(["karpathy"], t, SuiteOptions(annotations=str(world["ann"]), images=str(world["images"])))
        return t

    ckpts = [str(c) for c in world["ckpts"]]
    both = EmbedPipeline.from_checkpoints(str(world["cfg"]), ckpts, EmbedOptions(store=str(tmp_path / "a")))
    t_both = tables()
    both.run(t_both)
    EmbedPipeline.from_checkpoints(str(world["cfg"]), ckpts[:1], EmbedOptions(store=str(tmp_path / "b"))).run(tables())
    split = EmbedPipeline.from_checkpoints(str(world["cfg"]), ckpts, EmbedOptions(store=str(tmp_path / "b")))
    t_split = tables()
    st = split.run(t_split)
    assert [c["encoded"] for c in st["image"].per_checkpoint] == [0, N_IMAGES]
    for mod in ("image", "text"):
        np.testing.assert_allclose(split.embeddings(1, t_split)[mod], both.embeddings(1, t_both)[mod], atol=1e-6)


# -- grids ------------------------------------------------------------------------------------------
def test_run_reports_a_garbage_checkpoint_entry_and_runs_the_others(world, tmp_path, capsys):
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(np.random.default_rng(0).bytes(4096))
    job = tmp_path / "job.toml"
    job.write_text(textwrap.dedent(f"""
        out = "res"
        suites = ["karpathy"]
        [options]
        annotations = "{world['ann']}"
        images = "{world['images']}"
        store = "store"
        [[model]]
        name = "bad"
        model = "{world['cfg']}"
        checkpoints = ["{garbage}"]
        [[model]]
        name = "good"
        model = "{world['cfg']}"
        checkpoints = ["{world['ckpts'][0]}"]
    """))
    assert main(["run", str(job), "--quiet"]) != 0  # the exit code says an entry failed
    err = capsys.readouterr().err
    assert "hardrank run: bad: error:" in err and "1 of 2 entries failed: bad" in err and "Traceback" not in err
    assert (tmp_path / "res" / "good" / "epoch_1" / "karpathy.json").is_file()
    assert not list((tmp_path / "res").glob("bad/**/*.json"))


def test_a_checkpoint_with_nan_weights_is_bad_data_naming_it(world, tmp_path, capsys):
    from safetensors.torch import load_file, save_file

    nan = tmp_path / "diverged.safetensors"  # a training run that diverged: every weight NaN
    save_file({k: torch.full_like(v, float("nan")) if v.is_floating_point() else v
               for k, v in load_file(str(world["ckpts"][0])).items()}, str(nan))
    store = tmp_path / "store"
    assert main(_eval(world, tmp_path / "out", store, nan)) == 3  # was the ranking kernel's ValueError
    err = capsys.readouterr().err
    assert f"checkpoint {nan} encodes NaN or infinite embeddings" in err and "Traceback" not in err
    assert not list(store.rglob("shard-*.arrow"))  # nothing of it reaches the store, for a rerun to read back


# -- bring your own embeddings ----------------------------------------------------------------------
def _byo_rows(world, dim=8) -> list[tuple[str, str, list]]:
    rng = np.random.default_rng(1)
    rows = [("image", it["image"], rng.standard_normal(dim).tolist()) for it in world["clean"]]
    caps = dict.fromkeys(c for it in world["clean"] for c in it["caption"])
    return rows + [("text", c, rng.standard_normal(dim).tolist()) for c in caps]


def _write_byo(path: Path, rows, embedding=None) -> Path:
    pq.write_table(pa.table({"kind": [r[0] for r in rows], "id": [r[1] for r in rows],
                             "embedding": embedding if embedding is not None else [r[2] for r in rows]}), path)
    return path


def _byo_args(world, path, out) -> list[str]:
    return ["eval", "--embeddings", str(path), "--suite", "karpathy", "--annotations", str(world["ann"]),
            "--images", str(world["images"]), "--out", str(out), "--quiet"]


def test_byo_duplicated_and_malformed_embeddings(world, tmp_path, capsys):
    rows = _byo_rows(world)
    assert main(_byo_args(world, _write_byo(tmp_path / "ok.parquet", rows), tmp_path / "ok")) == 0
    ok = json.loads((tmp_path / "ok" / "ok" / "karpathy.json").read_text())["metrics"]
    # the same id twice with the same vector (a caption written once per occurrence): one item
    assert main(_byo_args(world, _write_byo(tmp_path / "same.parquet", rows + rows[3:5]), tmp_path / "same")) == 0
    assert json.loads((tmp_path / "same" / "same" / "karpathy.json").read_text())["metrics"] == ok
    capsys.readouterr()
    dup = ("image", rows[2][1], [-v for v in rows[2][2]])  # the same id, another vector: which one counts?
    assert main(_byo_args(world, _write_byo(tmp_path / "dup.parquet", rows + [dup]), tmp_path / "dup")) == 3
    err = capsys.readouterr().err
    assert f"image id {rows[2][1]!r} appears 2 times with different embeddings" in err and "dup.parquet" in err
    strings = [json.dumps(r[2]) for r in rows]
    assert main(_byo_args(world, _write_byo(tmp_path / "str.parquet", rows, strings), tmp_path / "s")) == 3
    err = capsys.readouterr().err
    assert "column 'embedding' is string, expected a list of floats" in err and "Traceback" not in err
    nan = [r[2] if i != 4 else [float("nan")] * 8 for i, r in enumerate(rows)]
    assert main(_byo_args(world, _write_byo(tmp_path / "nan.parquet", rows, nan), tmp_path / "n")) == 3
    assert f"id {rows[4][1]!r} has a NaN or infinite value" in capsys.readouterr().err


def test_byo_vectors_of_any_finite_magnitude_score_as_their_direction(world, tmp_path, capsys):
    """A float32 vector x 1e20 (its float32 norm overflows to inf), x 1e-25 (its squares underflow to 0)
    and a float64 vector x 1e300 (past float32's range) are the same directions: the same metrics.
    Only a vector of zeros has none: refused by name as all-zero."""
    rows = _byo_rows(world)
    ok_file = _write_byo(tmp_path / "ok.parquet", rows)
    assert main(_byo_args(world, ok_file, tmp_path / "ok")) == 0
    ok = json.loads((tmp_path / "ok" / "ok" / "karpathy.json").read_text())["metrics"]
    scale = {0: 1e20, 1: 1e-25, len(world["clean"]): 1e20, len(world["clean"]) + 1: 1e-25}
    f32 = pa.list_(pa.float32())
    scaled = pa.array([[v * scale.get(i, 1.0) for v in r[2]] for i, r in enumerate(rows)], f32)
    with np.errstate(over="ignore"):
        assert np.isinf(np.linalg.norm(np.asarray(scaled[0].as_py(), np.float32)))  # the float32 norm overflows
    assert main(_byo_args(world, _write_byo(tmp_path / "f32.parquet", rows, scaled), tmp_path / "f32")) == 0
    assert json.loads((tmp_path / "f32" / "f32" / "karpathy.json").read_text())["metrics"] == ok
    huge = [[v * 1e300 for v in r[2]] if i == 2 else r[2] for i, r in enumerate(rows)]  # float64 past float32
    assert main(_byo_args(world, _write_byo(tmp_path / "f64.parquet", rows, huge), tmp_path / "f64")) == 0
    assert json.loads((tmp_path / "f64" / "f64" / "karpathy.json").read_text())["metrics"] == ok
    capsys.readouterr()
    zero = [[0.0] * len(r[2]) if i == 3 else r[2] for i, r in enumerate(rows)]
    assert main(_byo_args(world, _write_byo(tmp_path / "zero.parquet", rows, zero), tmp_path / "z")) == 3
    err = capsys.readouterr().err
    assert f"zero.parquet: image id {rows[3][1]!r} has an all-zero embedding (every value is 0" in err


def test_an_image_listed_twice_in_the_annotations_is_scored_once(world, tmp_path, caplog):
    """The file lists image 2 twice, its captions split over the two entries: the same metrics and counts as
    the file listing it once (not two gallery items competing for its captions), a warning, and the record."""
    rows = _byo_rows(world)
    emb = _write_byo(tmp_path / "emb.parquet", rows)
    assert main(_byo_args(world, emb, tmp_path / "once")) == 0
    once = json.loads((tmp_path / "once" / "emb" / "karpathy.json").read_text())
    entries = [dict(it) for it in world["clean"]]
    im, caps = entries[2]["image"], entries[2]["caption"]
    entries[2]["caption"] = caps[:2]
    entries.append({"image": im, "caption": caps[2:]})
    twice = tmp_path / "twice.json"
    twice.write_text(json.dumps(entries))
    args = _byo_args(world, emb, tmp_path / "twice")
    args[args.index("--annotations") + 1] = str(twice)
    with caplog.at_level(logging.WARNING):
        assert main(args) == 0
    got = json.loads((tmp_path / "twice" / "emb" / "karpathy.json").read_text())
    assert got["counts"] == once["counts"] and got["metrics"] == once["metrics"]
    assert f"twice.json: 1 image(s) listed more than once (e.g. {im!r} at entries [2, {len(entries) - 1}])" \
        in caplog.text
    assert got["suite_meta"]["repeated_images"] == {"images": 1, "entries": len(entries),
                                                    "examples": {im: [2, len(entries) - 1]}}


def test_perturb_images_alters_an_image_listed_twice_once(world, tmp_path):
    """One altered copy per image, as the suites score it (it stopped with 'two inputs map to the same output')."""
    entries = [dict(it) for it in world["clean"]] + [{"image": world["clean"][0]["image"], "caption": ["again"]}]
    twice = tmp_path / "twice.json"
    twice.write_text(json.dumps(entries))
    assert main(["perturb", "images", "--method", "mix", "--images", str(world["images"]), "--annotations", str(twice),
                 "--out", str(tmp_path / "alt")]) == 0
    assert len(list((tmp_path / "alt" / "mix_0.9_s1").rglob("*.jpg"))) == N_IMAGES


# -- usage checked before any work -------------------------------------------------------------------
def _unwritable(tmp_path: Path) -> Path:
    """A folder this process cannot create or write (root ignores permission bits: use /proc)."""
    if os.geteuid() == 0:
        return Path("/proc/hardrank-test-out")
    ro = tmp_path / "read-only"
    ro.mkdir()
    ro.chmod(0o555)
    return ro / "out"


@pytest.mark.parametrize("which", ["out-read-only", "out-is-a-file", "store-is-a-file", "store-under-a-file",
                                   "store-read-only"])
def test_unwritable_out_or_store_fails_before_any_work(world, tmp_path, capsys, monkeypatch, which):
    import hardrank.embed.pipeline
    import hardrank.items

    work = []  # what "any work" would be: an image's bytes hashed, a model loaded
    monkeypatch.setattr(hardrank.items, "_image_key", lambda ref: work.append(("hash", ref)) or "")
    monkeypatch.setattr(hardrank.embed.pipeline, "load_model", lambda spec: work.append(("load", spec)))
    afile = tmp_path / "afile"
    afile.write_text("x")
    out, store = tmp_path / "out", tmp_path / "store"
    if which == "out-read-only":
        out = _unwritable(tmp_path)
    elif which == "out-is-a-file":
        out = afile
    elif which == "store-is-a-file":
        store = afile
    elif which == "store-under-a-file":
        store = afile / "store"
    else:
        store = _unwritable(tmp_path)
    assert main(_eval(world, out, store)) == 2
    err = capsys.readouterr().err
    flag = "--out" if which.startswith("out") else "--store"
    assert f"({flag}) is" in err and "Traceback" not in err
    assert work == []  # refused up front: no image hashed, no model loaded
    assert not list(tmp_path.rglob("shard-*.arrow")) and not list(tmp_path.rglob("karpathy.json"))
    if which == "out-read-only":
        assert main(_mine(world, out, tmp_path / "store")) == 2
        assert "(--out) is" in capsys.readouterr().err and work == []


@pytest.mark.parametrize("flags, message", [
    (("--batch-size", "0"), "option batch_size (--batch-size) must be a number >= 1, got 0"),
    (("--batch-size", "-5"), "option batch_size (--batch-size) must be a number >= 1, got -5"),
    (("--max-failures", "-1"), "option max_failures (--max-failures) must be a number >= 0, got -1"),
    (("--decode-threads", "0"), "option decode_threads (--decode-threads) must be a number >= 1, got 0"),
    (("--suite", "nope"), "unknown suite 'nope'; choose from"),
    (("--language", "de"), "option languages (--language) is for suites xm3600; this run's suites are karpathy"),
    (("--data", "sugarcrep=x"), "'sugarcrep' names no suite (did you mean 'sugarcrepe'?); suites: amodal, aro"),
    (("--images", "aro=x"), "option images is given for suite aro, which this run does not evaluate"),
    (("--device", "cuda"), "option device (--device) is 'cuda', but torch sees no CUDA GPU"),
    (("--device", "cuda:7"), "option device (--device) is 'cuda:7'"),
])
def test_bad_options_are_usage_errors(world, tmp_path, capsys, flags, message):
    if flags[0] == "--device" and torch.cuda.is_available() and flags[1] == "cuda":
        pytest.skip("a CUDA GPU is present")
    if flags[1] == "cuda:7" and torch.cuda.device_count() > 7:
        pytest.skip("eight GPUs present")
    assert main(_eval(world, tmp_path / "out", tmp_path / "store", extra=flags)) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("flag, env", [("--threads", None), ("--decode-threads", None), (None, "HARDRANK_THREADS"),
                                       (None, "OMP_NUM_THREADS")])
def test_a_thread_count_past_four_per_cpu_is_one_line_before_any_model_is_built(world, tmp_path, flag, env):
    """``--threads 100000`` segfaulted while the model was built (exit 139); each thread count, flag or
    environment, is checked first: one line naming it, what it got and the range (1..4 x os.cpu_count()).
    In a child process: the old failure took the interpreter with it."""
    args = _eval(world, tmp_path / "out", tmp_path / "store", extra=(flag, "100000") if flag else ())
    environ = {**os.environ, **({env: "100000"} if env else {})}
    for name in ("HARDRANK_THREADS", "OMP_NUM_THREADS"):
        if name != env:
            environ.pop(name, None)
    out = subprocess.run([sys.executable, "-m", "hardrank.jobs.cli", *args], capture_output=True, text=True,
                         timeout=600, env=environ)
    err = out.stderr.strip()
    assert out.returncode == 2 and len(err.splitlines()) == 1, (out.returncode, err[-3000:])
    ranged = rf"a whole number in 1\.\.{4 * os.cpu_count()} \(at most 4 per CPU; this machine has {os.cpu_count()}\)"
    if flag:
        option = flag[2:].replace("-", "_")
        assert re.fullmatch(rf"hardrank: error: option {option} \({flag}\) must be {ranged}, got 100000", err), err
    else:
        assert re.fullmatch(rf"hardrank: error: \${env} is '100000': set it to a thread count, {ranged}, or "
                            rf"unset it", err), err
    assert not (tmp_path / "store").exists()


# -- annotation files --------------------------------------------------------------------------------
@pytest.mark.parametrize("content, message", [
    (b"[]", "holds no images (an empty list)"),
    (b'[{"image": "val2014/COCO_val2014_000000000000.jpg", "caption": ["caf\xe9 au lait"]}]',
     "not UTF-8 text (byte b'\\xe9' at offset"),
    (b"", "not valid JSON"),
])
def test_bad_annotation_files_name_the_file(world, tmp_path, capsys, content, message):
    ann = tmp_path / "annotations.json"
    ann.write_bytes(content)
    for args in (_eval(world, tmp_path / "out", tmp_path / "store", ann=ann),
                 _mine(world, tmp_path / "mined", tmp_path / "store", ann=ann)):
        assert main(args) == 3
        err = capsys.readouterr().err
        assert f"{ann}: " in err and message in err, err


def test_every_query_lost_to_unreadable_images_is_an_error(world, tmp_path, capsys):
    images = tmp_path / "images"
    shutil.copytree(world["images"], images)
    for it in world["clean"]:
        (images / it["image"]).write_bytes(b"")
    assert main(_eval(world, tmp_path / "out", tmp_path / "store", images=images)) == 3
    err = capsys.readouterr().err
    assert "suite karpathy" in err and "lost every query to unreadable items" in err
    assert not (tmp_path / "out" / "epoch_1" / "karpathy.json").exists()  # no result of null metrics


# -- Ctrl-C -------------------------------------------------------------------------------------------
def test_ctrl_c_exits_130_keeps_finished_work_and_resumes(world, tmp_path):
    store, log = tmp_path / "store", tmp_path / "eval.log"
    proc = _spawn(_eval(world, tmp_path / "out", store), log, HR_TEST_GATE=tmp_path / "never", HR_TEST_GATE_AT=2,
                  HR_TEST_FLUSH_ROWS=4)
    try:
        _wait_for(log, "HR-TEST encoding", proc)  # the first batch of 4 images is committed, the second waits
        proc.send_signal(signal.SIGINT)
        assert proc.wait(120) == 130
    finally:
        proc.kill()
    err = log.read_text()
    assert "hardrank: interrupted; finished work is kept" in err and "Traceback" not in err
    counts = _check_store(store)
    assert [c["image"] for c in counts.values()] == [4]
    assert main(_eval(world, tmp_path / "out", store)) == 0
    assert _result(tmp_path / "out")["provenance"]["embed"]["image"]["encoded"] == N_IMAGES - 4


# -- kill -9 at random points -------------------------------------------------------------------------
def _killed(args, log: Path, delay: float | None, **env) -> bool:
    """Start a command, kill -9 it ``delay`` seconds after its work starts; whether it was killed mid-run.
    ``delay`` None: kill it when its 3rd encoder batch starts (blocked there: one shard of 2 batches is
    committed, the rest is not), which is mid-run whatever the machine's speed."""
    gate = {} if delay is not None else {"HR_TEST_GATE": log.with_suffix(".never"), "HR_TEST_GATE_AT": 3}
    proc = _spawn(args, log, **env, **gate)
    try:
        if delay is None:
            _wait_for(log, "HR-TEST encoding", proc)
        else:
            _wait_for(log, "loaded" if args[0] == "eval" else "model ", proc)
            time.sleep(delay)
        alive = proc.poll() is None
        if os.environ.get("HARDRANK_CHAOS_VERBOSE"):
            print(f"kill -9 {delay:.2f}s into {args[0]}: {'mid-run' if alive else 'already finished'}; "
                  f"{len(list(log.parent.rglob('shard-*.arrow')))} store shards, "
                  f"{len(list(log.parent.rglob('part-*.parquet')))} negatives shards so far")
        proc.send_signal(signal.SIGKILL)
        proc.wait(60)
        return alive
    finally:
        proc.kill()


def _outcomes(out: Path) -> list:
    return sorted(pq.read_table(p).to_pylist().__repr__() for p in sorted(out.rglob("karpathy.parquet")))


def _negatives(out: Path) -> list:
    t = pa.concat_tables([pq.read_table(p) for p in sorted((out / "negatives").glob("part-*.parquet"))])
    return list(zip(t.column("query_id").to_pylist(), t.column("rank").to_pylist(),
                    t.column("negative_id").to_pylist(), np.round(t.column("score").to_numpy(), 5).tolist()))


def _timed(args) -> float:
    """Run a command in this process (the reference and the resuming runs need no kill); its seconds."""
    t0 = time.monotonic()
    assert main(args) == 0
    return time.monotonic() - t0


def _chaos(world, tmp_path, rounds: int, seed: int) -> None:
    """kill -9 eval and mine ``rounds`` times each at random points of their work (key hashing,
    encoding, shard commits, scoring, result and negatives writes), resume, and compare with one
    uninterrupted run: same metrics, same outcomes, same negatives, a consistent store. The first kill
    of each command is at a fixed point mid-encode (a random one may land after the run finished, more
    often on a loaded machine), so every run tests at least one interrupted run."""
    rng = random.Random(seed)
    env = {"HR_TEST_FLUSH_ROWS": 8}  # a shard every two batches of 4: kills land between commits
    ev = lambda out, store, quiet=True: _eval(world, out, store, *world["ckpts"], quiet=quiet)  # K = 2
    span = _timed(ev(tmp_path / "ref", tmp_path / "ref_store"))
    out, store = tmp_path / "out", tmp_path / "store"
    hits = []
    for i in range(rounds):
        delay = None if i == 0 else rng.uniform(0, span)
        hits.append(_killed(ev(out, store, quiet=False), tmp_path / f"kill{i}.log", delay, **env))
        if store.exists():
            _check_store(store, killed=True)  # every state a kill leaves is consistent
    assert hits[0], "the gated kill found the run finished"
    _timed(ev(out, store))
    for label in ("epoch_1", "epoch_2"):
        assert _result(out, label)["metrics"] == _result(tmp_path / "ref", label)["metrics"], label
    assert _outcomes(out) == _outcomes(tmp_path / "ref")
    assert _check_store(store) == _check_store(tmp_path / "ref_store")
    # mine: one negatives shard per 8 queries, so kills land between those too
    mi = lambda out, store, quiet=True: _mine(world, out, store, extra=("--block-size", "8", "--no-dup-filter"),
                                              quiet=quiet)
    span = _timed(mi(tmp_path / "mref", tmp_path / "mref_store"))
    hits = [_killed(mi(tmp_path / "mined", tmp_path / "mstore", quiet=False), tmp_path / f"mkill{i}.log",
                    None if i == 0 else rng.uniform(0, span), **env) for i in range(rounds)]
    assert hits[0], "the gated kill found the run finished"
    _timed(mi(tmp_path / "mined", tmp_path / "mstore"))
    assert _negatives(tmp_path / "mined") == _negatives(tmp_path / "mref") != []
    summary = json.loads((tmp_path / "mined" / "summary.json").read_text())
    ref = json.loads((tmp_path / "mref" / "summary.json").read_text())
    assert summary["counts"] == ref["counts"] and summary["score_histogram"] == ref["score_histogram"]
    _check_store(tmp_path / "mstore")


def test_kill_9_at_random_points_then_resume_gives_the_uninterrupted_results(world, tmp_path):
    _chaos(world, tmp_path, rounds=2, seed=int(os.environ.get("HARDRANK_CHAOS_SEED", "0")))


@pytest.mark.chaos
@pytest.mark.parametrize("seed", range(3))
def test_chaos_loop_kill_9_many_times(world, tmp_path, seed):
    _chaos(world, tmp_path, rounds=8, seed=seed)


# -- a store this user cannot write -------------------------------------------------------------------
_FS_IOC_GETFLAGS, _FS_IOC_SETFLAGS, _FS_IMMUTABLE_FL = 0x80086601, 0x40086602, 0x10


def _set_immutable(path: Path, on: bool) -> None:
    """chattr +i / -i: an immutable file or folder refuses every write, root's too (CAP_LINUX_IMMUTABLE)."""
    import array
    import fcntl

    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        flags = array.array("l", [0])
        fcntl.ioctl(fd, _FS_IOC_GETFLAGS, flags, True)
        flags[0] = flags[0] | _FS_IMMUTABLE_FL if on else flags[0] & ~_FS_IMMUTABLE_FL
        fcntl.ioctl(fd, _FS_IOC_SETFLAGS, flags)
    finally:
        os.close(fd)


@contextlib.contextmanager
def _read_only(*folders: Path):
    """``folders`` and everything in them refuse writes at the kernel, as another user's folder or a read-only
    mount would: by their permission bits for a normal user; as root, who ignores permission bits, by the
    immutable flag (chattr +i). Root where the flag is unsupported (tmpfs, no CAP_LINUX_IMMUTABLE): skipped."""
    paths = [p for f in folders for p in (f, *f.rglob("*"))]
    done: list[tuple[Path, int]] = []
    try:
        for p in paths:
            if os.geteuid() == 0:
                try:
                    _set_immutable(p, True)
                except OSError as exc:
                    pytest.skip(f"cannot make {p} read-only for root here (chattr +i: {exc.strerror})")
                done.append((p, -1))
            else:
                mode = p.stat().st_mode
                p.chmod(mode & ~0o222)
                done.append((p, mode))
        probe = folders[0] / "probe"
        with pytest.raises(PermissionError):  # the simulation holds: a write fails as it would for the run
            probe.write_bytes(b"")
        yield
    finally:
        for p, mode in reversed(done):
            _set_immutable(p, False) if mode < 0 else p.chmod(mode)


def _listing(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*")}


@pytest.mark.parametrize("which", ["model-folder", "whole-store"])
def test_a_store_that_cannot_be_written_serves_the_embeddings_it_holds(world, tmp_path, capsys, which):
    """A shared store (the root writable, the model's folder another user's) or a read-only cache (nothing
    writable): a run it holds every embedding of reads them and writes nothing there. The images are a
    copy under another path, so their identities are new: recording them is what used to fail (a
    PermissionError traceback in idkeys.commit)."""
    store = tmp_path / "store"
    assert main(_eval(world, tmp_path / "clean", store)) == 0
    clean = _result(tmp_path / "clean")
    folder = store / clean["model_fingerprint"]
    images = tmp_path / "images"
    shutil.copytree(world["images"], images)
    before = _listing(store)
    with _read_only(*([folder] if which == "model-folder" else [store])):
        capsys.readouterr()
        assert main(_eval(world, tmp_path / "again", store, images=images)) == 0
        assert main(_mine(world, tmp_path / "mined", store, images=images)) == 0
        assert "Traceback" not in capsys.readouterr().err
    assert _listing(store) == before  # not a lock, a manifest or an id record written
    again = _result(tmp_path / "again")
    assert again["metrics"] == clean["metrics"]
    assert again["provenance"]["embed"]["image"]["from_store"] == N_IMAGES
    assert again["provenance"]["embed"]["image"]["encoded"] == again["provenance"]["embed"]["text"]["encoded"] == 0
    assert json.loads((tmp_path / "mined" / "summary.json").read_text())["counts"]["corpus"] == N_IMAGES


@pytest.mark.parametrize("which", ["model-folder", "whole-store"])
def test_a_store_that_cannot_be_written_and_lacks_items_is_refused_before_encoding(world, tmp_path, capsys, which):
    store = tmp_path / "store"
    few = tmp_path / "few.json"
    few.write_text(json.dumps(world["clean"][:6]))
    assert main(_eval(world, tmp_path / "few", store, ann=few)) == 0
    folder = store / _result(tmp_path / "few")["model_fingerprint"]
    before = _listing(store)
    with _read_only(*([folder] if which == "model-folder" else [store])):
        capsys.readouterr()
        assert main(_eval(world, tmp_path / "all", store)) == 2  # 4 images and their captions are missing
        err = capsys.readouterr().err
        assert f"store folder {folder} cannot be written (" in err and "lacks 4 images and 20 texts" in err
        assert "pass a --store this user can write" in err and "Traceback" not in err
        if which == "whole-store":  # another model: its folder cannot be made
            assert main(_eval(world, tmp_path / "other", store, world["ckpts"][1])) == 2
            err = capsys.readouterr().err
            assert "cannot create the store folder" in err and str(store) in err and "Traceback" not in err
    assert _listing(store) == before  # nothing encoded, nothing written
    assert not list(tmp_path.glob("all/**/karpathy.json"))


# -- a full disk ------------------------------------------------------------------------------------
def _enospc(path) -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(path))


@pytest.mark.parametrize("where", ["lock", "shard", "result"])
def test_a_full_disk_is_one_line_and_leaves_nothing_corrupt(world, tmp_path, capsys, monkeypatch, where):
    """ENOSPC at the store's lock file, at a store shard (half written) and at a result file (half
    written): one line naming the file and the space it needed, exit 5, no temporary left behind; once
    there is space again a rerun succeeds and equals a clean run."""
    import hardrank.store.embedding_store as store_mod

    assert main(_eval(world, tmp_path / "clean", tmp_path / "clean_store")) == 0
    clean = _result(tmp_path / "clean")
    fp = clean["model_fingerprint"]
    store, out = tmp_path / "store", tmp_path / "out"
    if where == "lock":
        def pwrite(fd, data, offset):
            raise _enospc(store / fp / ".lock")  # (as the kernel's, without a file name)
        monkeypatch.setattr(store_mod.os, "pwrite", pwrite)
        named = store / fp / ".lock"
    elif where == "shard":
        real = store_mod.pa.OSFile

        def osfile(path, mode="r"):
            if "/image/.shard-" in path:
                Path(path).write_bytes(b"ARROW1" + b"\0" * 100)  # what fitted before the disk filled
                raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on "
                                            "device")  # pyarrow's wording, no file name
            return real(path, mode)
        monkeypatch.setattr(store_mod.pa, "OSFile", osfile)
        named = store / fp / "image" / "shard-"
    else:
        real_write = Path.write_bytes

        def write_bytes(self, data):
            if self.name.startswith(".karpathy.json."):
                real_write(self, data[:len(data) // 2])
                raise _enospc(self)
            return real_write(self, data)
        monkeypatch.setattr(Path, "write_bytes", write_bytes)
        named = out / "epoch_1" / "karpathy.json"
    capsys.readouterr()
    assert main(_eval(world, out, store)) == 5
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1, err
    assert err[0].startswith(f"hardrank: error: no space left on the device writing {named}"), err[0]
    assert "it needs about " in err[0] and " free there)" in err[0] and "run the same command again" in err[0]
    monkeypatch.undo()
    assert not list(tmp_path.rglob("*.tmp"))  # no half file left
    assert not (out / "epoch_1" / "karpathy.json").exists()
    if where == "lock":  # the first lock of a new store: before its manifest (rebuilt from the shards: none)
        assert not list(store.rglob("shard-*.arrow")) and not list(store.rglob("manifest.json"))
    else:
        _check_store(store)  # each key once, the manifest listing exactly the shards on disk
    assert main(_eval(world, out, store)) == 0
    assert _result(out)["metrics"] == clean["metrics"]
    assert _check_store(store) == _check_store(tmp_path / "clean_store")


def test_a_full_disk_at_an_unnamed_write_is_one_line_too(world, tmp_path, capsys, monkeypatch):
    """A write without its own message (a folder created on a full disk) still ends in one line, exit 5."""
    real_mkdir = Path.mkdir

    def mkdir(self, *a, **kw):
        if self.name == "epoch_1":
            raise _enospc(self)
        return real_mkdir(self, *a, **kw)
    monkeypatch.setattr(Path, "mkdir", mkdir)
    assert main(_eval(world, tmp_path / "out", tmp_path / "store")) == 5
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "Traceback" not in err[0], err
    assert err[0].startswith(f"hardrank: error: no space left on the device writing {tmp_path / 'out' / 'epoch_1'} "
                             f"(") and " free there)" in err[0]


# -- SIGTERM ----------------------------------------------------------------------------------------
def test_sigterm_flushes_what_was_encoded_exits_143_and_resumes(world, tmp_path):
    """What Slurm, Kubernetes and systemd send: handled as Ctrl-C. The shard buffer is not full (no
    HR_TEST_FLUSH_ROWS), so the two batches encoded before the signal reach the store only by the flush
    the interrupt runs; the default SIGTERM would drop them."""
    store, log = tmp_path / "store", tmp_path / "eval.log"
    proc = _spawn(_eval(world, tmp_path / "out", store), log, HR_TEST_GATE=tmp_path / "never", HR_TEST_GATE_AT=3)
    try:
        _wait_for(log, "HR-TEST encoding", proc)  # batches 1 and 2 (8 images) encoded, batch 3 waits
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(120) == 143
    finally:
        proc.kill()
    err = log.read_text()
    assert "hardrank: terminated (SIGTERM); finished work is kept" in err and "Traceback" not in err
    assert [c["image"] for c in _check_store(store).values()] == [8]
    assert main(_eval(world, tmp_path / "out", store)) == 0
    assert _result(tmp_path / "out")["provenance"]["embed"]["image"]["encoded"] == N_IMAGES - 8


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_watch_stopped_by_sigterm_exits_143(tmp_path, capsys, monkeypatch, signum, code):
    """``hardrank watch`` runs as a service (systemd, a Kubernetes pod): SIGTERM is how it is stopped."""
    from hardrank.jobs import cmd_watch as watch_mod

    def watching(cfg, **kw):
        assert callable(signal.getsignal(signum)), "no handler: the signal would kill the test run"
        os.kill(os.getpid(), signum)  # delivered to this (main) thread: the handler runs before the next line
        time.sleep(5)
        raise AssertionError("the signal did not stop the watch")
    monkeypatch.setattr(watch_mod, "watch", watching)
    assert main(["watch", str(tmp_path), "--suite", "toy", "--out", str(tmp_path / "out"), "--quiet"]) == code
    assert f"hardrank watch: stopped; the results so far are in {tmp_path / 'out'}" in capsys.readouterr().err


def test_sigterm_stays_handled_after_ray_starts(monkeypatch):
    """``ray.init`` sets the driver's SIGTERM handler to ``sys.exit`` (ray/_private/worker.py): with
    ``--executor ray`` that would end the run with exit 15 and no message. Its effect is reproduced here
    (a real local cluster takes ~20 s to start on the test machine)."""
    pytest.importorskip("ray")
    from hardrank.executors import ray_embed as ray_executor
    from hardrank.jobs import cli

    ray_like = lambda signum, frame: sys.exit(signum)  # noqa: E731
    monkeypatch.setattr(ray_executor.ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray_executor.ray, "init", lambda **kw: signal.signal(signal.SIGTERM, ray_like))
    with cli._sigterm_as_interrupt():
        ours = signal.getsignal(signal.SIGTERM)
        assert ray_executor.connect() is True
        assert signal.getsignal(signal.SIGTERM) is ours
    before = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    try:  # outside the command line (no handler of ours), Ray's stays
        ray_executor.connect()
        assert signal.getsignal(signal.SIGTERM) is ray_like
    finally:
        signal.signal(signal.SIGTERM, before)


# -- job-file names -----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["../../../x", "a/b", "..", ".", "", "a\\b"])
def test_a_job_file_name_is_one_folder_inside_out(world, tmp_path, capsys, name):
    job = tmp_path / "jobs" / "job.toml"
    job.parent.mkdir()
    job.write_text(textwrap.dedent(f"""
        out = "res"
        suites = ["karpathy"]
        [options]
        annotations = "{world['ann']}"
        images = "{world['images']}"
        store = "store"
        [[model]]
        name = {json.dumps(name)}
        model = "{world['cfg']}"
        checkpoints = ["{world['ckpts'][0]}"]
    """))
    for flags in (["--dry-run"], ["--quiet"]):
        assert main(["run", str(job), *flags]) == 2
        err = capsys.readouterr().err
        assert f"{job}: [[model]] #1: name {name!r} is not a folder name" in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["job.toml", "jobs"]  # nothing written anywhere
    assert not (tmp_path.parent / "x").exists()  # where "../../../x" pointed


def test_a_job_file_name_with_dots_inside_is_a_folder_name(tmp_path):
    from hardrank.jobs.grid import load_job

    job = tmp_path / "job.toml"
    job.write_text('out = "res"\nsuites = ["karpathy"]\n[[model]]\nname = "v1..rc2"\nmodel = "ViT-B-32"\n')
    (m,) = load_job(job).models
    assert m.name == "v1..rc2" and Path(m.config.out) == tmp_path / "res" / "v1..rc2"


# -- files that are no image ---------------------------------------------------------------------------
def test_a_file_that_is_no_image_is_named_by_its_kind_never_quoted(world, tmp_path, caplog):
    images = tmp_path / "images"
    shutil.copytree(world["images"], images)
    secret = b"root:x:0:0:root:/root:/bin/bash\nSECRET-TOKEN-1234\n"  # what an annotation naming /etc/passwd reads
    contents = {0: secret, 1: b"<!DOCTYPE html><title>SECRET-TOKEN-1234</title>", 2: b"%PDF-1.7 SECRET-TOKEN-1234",
                3: b"\x00\x01SECRET-TOKEN-1234" + bytes(range(256))}
    kinds = {0: "a text file", 1: "an HTML page", 2: "a PDF document", 3: "binary data of an unrecognised format"}
    for i, data in contents.items():
        (images / world["clean"][i]["image"]).write_bytes(data)
    with caplog.at_level(logging.WARNING):
        assert main(_eval(world, tmp_path / "out", tmp_path / "store", images=images)) == 0
    res = _result(tmp_path / "out")
    reasons = {f["source"]: f["reason"] for f in res["failures"]}
    for i, data in contents.items():
        path = str(images / world["clean"][i]["image"])
        assert reasons[path].startswith(f"DataError: {path}: not an image Pillow can read; {len(data)} bytes: "
                                        f"{kinds[i]}")
    for text in (caplog.text, (tmp_path / "out" / "epoch_1" / "karpathy.json").read_text()):
        assert "SECRET" not in text and "root:x" not in text


def test_bad_xm3600_files_exit_with_one_line_naming_line_key_and_language(tmp_path, capsys):
    """The Failure modes row of --suite xm3600: a language the file lacks (2), an entry without captions (3)."""
    lines = [{"image/key": "k0", "en": {"caption": ["a cat"]}, "de": {"caption": ["eine Katze"]}},
             {"image/key": "k1", "en": {"caption": ["a dog"]}, "de": {"caption": "ein Hund"}}]
    ann = tmp_path / "captions.jsonl"
    ann.write_text("".join(json.dumps(x) + "\n" for x in lines))
    base = ["eval", "--suite", "xm3600", "--annotations", str(ann), "--embeddings", str(tmp_path / "e.parquet"),
            "--out", str(tmp_path / "out"), "--quiet"]
    assert main([*base, "--language", "en", "fr"]) == 2
    err = capsys.readouterr().err
    assert "language(s) ['fr'] not in" in err and "it has ['de', 'en']" in err and "Traceback" not in err
    assert main([*base, "--language", "de"]) == 3
    err = capsys.readouterr().err
    assert "line 2 (image k1), language 'de'" in err and "'caption' = 'ein Hund'" in err and "Traceback" not in err


# -- classification, corruption and xm3600 inputs (round four) -----------------------------------------
CLASSES3 = ("bird", "cat", "dog")


def _class_folder(root: Path, per_class: int = 2) -> Path:
    """An ImageFolder tree root/<class>/<n>.jpg, as torchvision reads it."""
    rng = np.random.default_rng(0)
    for c in CLASSES3:
        for i in range(per_class):
            write_image(root / c / f"{i}.jpg", rng, size=(36, 36))
    return root


def _cb_root(root: Path, folder: Path) -> Path:
    """CLIP_benchmark's WebDataset root as its converter writes it (webdataset's TarWriter): classnames.txt,
    zeroshot_classification_templates.txt, test/nshards.txt and test/0.tar of <key>.jpg + <key>.cls."""
    import webdataset as wds

    (root / "test").mkdir(parents=True)
    (root / "classnames.txt").write_text("\n".join(CLASSES3) + "\n")
    (root / "zeroshot_classification_templates.txt").write_text("a photo of a {c}.\n")
    (root / "test" / "nshards.txt").write_text("1")
    with wds.TarWriter(str(root / "test" / "0.tar")) as w:
        for i, f in enumerate(sorted(folder.rglob("*.jpg"))):
            w.write({"__key__": f"s{i:07d}", "jpg": f.read_bytes(), "cls": CLASSES3.index(f.parent.name)})
    return root


def _zs(images, tmp_path, *extra) -> list[str]:
    """eval --suite classification scoring embeddings from a file (the suite is read before the file)."""
    return ["eval", "--suite", "classification", "--images", str(images), "--embeddings",
            str(tmp_path / "e.parquet"), "--out", str(tmp_path / "res"), "--quiet", *extra]


def _load_zs(**opts):
    from hardrank import SuiteOptions, Tables
    from hardrank.config import build
    from hardrank.suites import load_suites

    tables = Tables.empty()
    (suite,) = load_suites(["classification"], tables, build(SuiteOptions, opts))  # classnames: the suite's own
    return suite, tables


def test_class_names_differing_only_by_spaces_are_refused_naming_both_lines(tmp_path, capsys):
    """A JSON list's ' cat' and 'cat' were two classes of one prompt: the folder's images took the later label
    and lost every tie to the earlier one (a right answer scored wrong). Stripped first, a repeat names both
    entries (a text file's: both lines)."""
    from hardrank.suites.classification import read_classnames

    root = _class_folder(tmp_path / "if")
    names = tmp_path / "names.json"
    names.write_text(json.dumps(["bird", "cat", "dog", " cat"]))
    assert main(_zs(root, tmp_path, "--classnames", str(names))) == 3
    err = capsys.readouterr().err
    assert f"{names}: class name 'cat' is listed twice (entries 2 and 4, surrounding spaces ignored)" in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    (tmp_path / "names.txt").write_text("cat\ndog\t\n\tdog\n")
    with pytest.raises(DataError, match=r"'dog' is listed twice \(lines 2 and 3"):
        read_classnames(str(tmp_path / "names.txt"))
    # 100,000 names (CLIP_benchmark's largest sets have 21k): one pass, a repeat far apart still named by both lines
    lines = [f"class {i}" for i in range(100_000)]
    big = tmp_path / "big.txt"
    big.write_text("\n".join(lines[:99_998] + [" class 2"] + lines[99_999:]) + "\n")
    with pytest.raises(DataError, match=r"'class 2' is listed twice \(lines 3 and 99999,"):
        read_classnames(str(big))
    big.write_text("\n".join(lines) + "\n\n")
    assert read_classnames(str(big)) == lines


@pytest.mark.parametrize("fmt", ["parquet", "csv"])
def test_a_label_that_is_not_a_whole_number_is_refused_naming_file_row_and_value(tmp_path, capsys, fmt):
    """A Parquet float label 1.7 was truncated to class 1 and scored."""
    root = _class_folder(tmp_path / "if", per_class=1)
    (tmp_path / "names.txt").write_text("\n".join(CLASSES3))
    images = ["bird/0.jpg", "cat/0.jpg", "dog/0.jpg"]
    table = tmp_path / f"labels.{fmt}"
    if fmt == "parquet":
        pq.write_table(pa.table({"image": images, "label": [0.0, 1.7, 2.0]}), table)
    else:
        table.write_text("image,label\n" + "".join(f"{i},{v}\n" for i, v in zip(images, ("0", "1.7", "2.0"))))
    assert main(_zs(root, tmp_path, "--annotations", str(table), "--classnames", str(tmp_path / "names.txt"))) == 3
    err = capsys.readouterr().err
    value = "1.7" if fmt == "parquet" else "'1.7'"
    assert f"{table}: row 1 label {value} is not a whole number" in err and "Traceback" not in err
    # whole numbers written as floats (a Parquet float column) are the classes they name
    if fmt == "parquet":
        pq.write_table(pa.table({"image": images, "label": [0.0, 1.0, 2.0]}), table)
    else:
        table.write_text("image,label\n" + "".join(f"{i},{v}\n" for i, v in zip(images, ("0", "1.0", "2"))))
    suite, _ = _load_zs(images=str(root), annotations=str(table), classnames=str(tmp_path / "names.txt"))
    assert suite.classify[0].labels.tolist() == [0, 1, 2]


def test_a_byte_order_mark_never_reaches_the_prompts(tmp_path):
    """Windows editors start a UTF-8 file with U+FEFF: it was kept in the first class name and template."""
    bom = "\ufeff"
    root = _class_folder(tmp_path / "if", per_class=1)
    (tmp_path / "names.txt").write_text(bom + "bird\ncat\ndog\n", encoding="utf-8")
    (tmp_path / "names.json").write_text(bom + json.dumps(list(CLASSES3)), encoding="utf-8")
    (tmp_path / "t.txt").write_text(bom + "a photo of a {c}.\n", encoding="utf-8")
    (tmp_path / "labels.csv").write_text(bom + "image,label\nbird/0.jpg,bird\ncat/0.jpg,1\ndog/0.jpg,dog\n",
                                         encoding="utf-8")
    cb = _cb_root(tmp_path / "cb", root)
    for f in ("classnames.txt", "zeroshot_classification_templates.txt"):
        (cb / f).write_text(bom + (cb / f).read_text(), encoding="utf-8")
    want = [f"a photo of a {c}." for c in CLASSES3]
    for opts in (dict(images=str(root), classnames=str(tmp_path / "names.txt"), templates=str(tmp_path / "t.txt")),
                 dict(images=str(root), classnames=str(tmp_path / "names.json"), templates=str(tmp_path / "t.txt")),
                 dict(images=str(root), annotations=str(tmp_path / "labels.csv"),
                      classnames=str(tmp_path / "names.txt"), templates=str(tmp_path / "t.txt")),
                 dict(images=str(cb))):
        suite, tables = _load_zs(**opts)
        assert suite.classify[0].classnames == list(CLASSES3), opts
        assert list(tables.texts.entries) == want, opts
        assert suite.classify[0].labels.tolist() == [0, 1, 2] * (len(suite.classify[0].labels) // 3)


def test_a_negative_seed_is_refused_before_anything_is_written(tmp_path, capsys):
    """--seed -1 wrote <corruption>_1_s-1/, which the next run did not skip as a variant folder and corrupted."""
    root = _class_folder(tmp_path / "if", per_class=1)
    out = tmp_path / "if-variants"
    assert main(["perturb", "images", "--method", "corrupt:fog", "--severity", "1", "--seed", "-1", "--images",
                 str(root), "--out", str(out)]) == 2
    assert "option seed (--seed) must be a number >= 0, got -1" in capsys.readouterr().err
    assert not out.exists()
    assert main([*_zs(root, tmp_path), "--image-variants", "fog_1", "--seeds", "1", "-1"]) == 2
    assert "option seeds (--seeds) takes numbers >= 0, got -1" in capsys.readouterr().err


def test_image_folder_variants_go_beside_the_root_where_eval_finds_them(tmp_path, capsys):
    """Variant folders inside an ImageFolder root are classes to torchvision and CLIP_benchmark, and an --out below
    --images was walked (and corrupted) again by the next run: both refused; beside the root, eval's
    --variants-dir finds them, a rerun writes nothing, the root's classes stay its classes."""
    from torchvision.datasets import ImageFolder

    root = _class_folder(tmp_path / "if")
    base = ["perturb", "images", "--method", "corrupt:fog", "--severity", "1", "--seed", "1", "--images", str(root)]
    beside = tmp_path / "if-variants"
    for out in (root, root / "out"):
        assert main([*base, "--out", str(out)]) == 2
        err = capsys.readouterr().err
        assert f"--out {out} is inside --images {root}" in err and f"--out {beside} (then eval --images {root} " \
            f"--variants-dir {beside})" in err
    assert sorted(os.listdir(root)) == list(CLASSES3)
    assert main([*base, "--out", str(beside)]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["written"] == 6
    assert f"evaluate with --images {root} --variants-dir {beside} --image-variants fog_1 --seeds 1" in err
    assert main([*base, "--out", str(beside)]) == 0 and json.loads(capsys.readouterr()[0])["skipped"] == 6
    assert ImageFolder(str(root)).classes == list(CLASSES3)
    assert ImageFolder(str(beside / "fog_1_s1")).classes == list(CLASSES3)  # each variant an ImageFolder root too
    suite, tables = _load_zs(images=str(root), variants_dir=str(beside), image_variants=("fog_1",), seeds=(1,))
    t = suite.classify[0]
    assert t.groups == ["clean", "fog_1_s1"] and suite.check_images() is None
    assert [tables.images.entries[r].uri for r in t.query_items[1]] == [str(beside / "fog_1_s1" / i)
                                                                         for i in t.query_ids]
    suite, _ = _load_zs(images=str(root), image_variants=("fog_1",), seeds=(1,))
    with pytest.raises(FileNotFoundError, match=rf"--out {beside}` and pass --variants-dir {beside}"):
        suite.check_images()


@pytest.mark.parametrize("text", ["abc", "-3", "0"])
def test_a_bad_nshards_file_is_one_line_naming_it(tmp_path, capsys, text):
    cb = _cb_root(tmp_path / "cb", _class_folder(tmp_path / "if", per_class=1))
    (cb / "test" / "nshards.txt").write_text(text + "\n")
    assert main(_zs(cb, tmp_path)) == 3
    err = capsys.readouterr().err
    assert f"{cb / 'test' / 'nshards.txt'}: expected the number of shards" in err and repr(text) in err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_a_one_pixel_image_to_corrupt_is_named(tmp_path, capsys):
    from PIL import Image

    root = _class_folder(tmp_path / "if", per_class=1)
    Image.new("RGB", (1, 1)).save(root / "cat" / "tiny.png")
    assert main(["perturb", "images", "--method", "corrupt:fog", "--severity", "1", "--images", str(root), "--out",
                 str(tmp_path / "v")]) == 3
    err = capsys.readouterr().err
    assert f"{root / 'cat' / 'tiny.png'}: image of 1x1 px is too small to corrupt" in err and "Traceback" not in err
    import io

    import webdataset as wds

    (tmp_path / "shards").mkdir()
    buf = io.BytesIO()
    Image.new("RGB", (1, 1)).save(buf, format="PNG")
    with wds.TarWriter(str(tmp_path / "shards" / "00000.tar")) as w:
        w.write({"__key__": "big", "jpg": (root / "cat" / "0.jpg").read_bytes(), "txt": "a cat"})
        w.write({"__key__": "tiny", "png": buf.getvalue(), "txt": "a dot"})
    assert main(["perturb", "images", "--method", "corrupt:fog", "--severity", "1", "--images",
                 str(tmp_path / "shards" / "00000.tar"), "--out", str(tmp_path / "shards")]) == 3
    err = capsys.readouterr().err
    assert "00000.tar" in err and "(sample 00000.tar#tiny): image of 1x1 px is too small" in err
    assert "Traceback" not in err


def test_perturbing_clip_benchmark_shards_prints_the_classification_command(tmp_path, capsys):
    """The next command was --suite wds, which fails on classification shards ("no caption")."""
    cb = _cb_root(tmp_path / "cb", _class_folder(tmp_path / "if"))
    shards = str(cb / "test" / "0.tar")
    assert main(["perturb", "images", "--method", "corrupt:fog", "--severity", "1", "--seed", "0", "--images", shards,
                 "--out", str(cb / "test")]) == 0
    err = capsys.readouterr().err
    assert f"evaluate with --suite classification --images {cb} --image-variants fog_1 --seeds 0" in err
    assert "--suite wds" not in err
    suite, _ = _load_zs(images=str(cb), image_variants=("fog_1",), seeds=(0,))  # what it says finds the variant
    assert suite.classify[0].groups == ["clean", "fog_1_s0"]
    # elsewhere: the command names the folder
    assert main(["perturb", "images", "--method", "corrupt:fog", "--severity", "2", "--seed", "0", "--images", shards,
                 "--out", str(tmp_path / "elsewhere")]) == 0
    err = capsys.readouterr().err
    assert (f"--suite classification --images {cb} --variants-dir {tmp_path / 'elsewhere'} --image-variants fog_2 "
            f"--seeds 0") in err
    suite, _ = _load_zs(images=str(cb), image_variants=("fog_2",), seeds=(0,), variants_dir=str(tmp_path / "elsewhere"))
    assert suite.classify[0].groups == ["clean", "fog_2_s0"]
    # CLIP_benchmark's root given as the folder: its shards named
    assert main(["perturb", "images", "--method", "corrupt:fog", "--severity", "1", "--images", str(cb), "--out",
                 str(cb)]) == 3
    assert f"it is CLIP_benchmark's WebDataset root: corrupt its shards, --images '{cb / 'test'}/{{0..0}}.tar'" \
        in capsys.readouterr().err


# -- round four: outputs checked first, empty files, damaged results ---------------------------------------
@pytest.mark.parametrize("which", ["report", "export", "store-export"])
def test_an_output_folder_that_cannot_be_written_is_refused_up_front(world, tmp_path, capsys, which):
    """`report --out`, `export --out` and `store export --out` into a read-only folder: one line naming the
    option and the folder, as `eval --out` gets, before anything is written (they used to fail part-way, with
    a PermissionError traceback)."""
    store = tmp_path / "store"
    assert main(_eval(world, tmp_path / "res", store)) == 0
    folder = tmp_path / "ro"
    folder.mkdir()
    fp = store / _result(tmp_path / "res")["model_fingerprint"]
    args = {"report": ["report", str(tmp_path / "res"), "--out", str(folder / "rep")],
            "export": ["export", str(tmp_path / "res"), "--format", "clip_benchmark", "--out", str(folder / "cb")],
            "store-export": ["store", "export", str(fp), "--suite", "karpathy", "--annotations", str(world["ann"]),
                             "--images", str(world["images"]), "--out", str(folder / "e.parquet")]}[which]
    option = "file (--out)" if which == "store-export" else "out (--out"
    with _read_only(folder):
        capsys.readouterr()
        assert main(args) == 2
        err = capsys.readouterr().err
        assert f"option {option}" in err and str(folder) in err and "cannot be written" in err, err
        assert "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert list(folder.iterdir()) == []
    if which == "store-export":  # a folder where the file goes: named too
        assert main([*args[:-1], str(folder)]) == 2
        assert "which is a folder; name the Parquet file to write" in capsys.readouterr().err


def test_export_training_with_a_wrong_name_is_refused_before_anything_is_embedded(world, tmp_path, capsys,
                                                                                    monkeypatch):
    """`mine --export-training x.parquet` (no such format), or a NegCLIP table from inputs without (image,
    caption) pairs: refused before the model is loaded (it used to be refused after the embedding)."""
    import hardrank.embed.pipeline

    work = []
    monkeypatch.setattr(hardrank.embed.pipeline, "load_model", lambda spec: work.append(("load", spec)))
    assert main(_mine(world, tmp_path / "a", tmp_path / "store", extra=("--export-training",
                                                                          str(tmp_path / "x.parquet")))) == 2
    err = capsys.readouterr().err
    assert f"--export-training {tmp_path / 'x.parquet'}: name a .tsv or .csv" in err and "Traceback" not in err
    assert work == [] and not list(tmp_path.rglob("shard-*.arrow"))
    folder = tmp_path / "imgs"
    shutil.copytree(world["images"], folder)  # an image folder: images without captions, so no pairs
    args = ["mine", "--model", str(world["cfg"]), "--checkpoint", str(world["ckpts"][0]), "--corpus", str(folder),
            "--queries", str(folder), "--direction", "i2i", "--out", str(tmp_path / "b"), "--store",
            str(tmp_path / "store"), "--quiet", "--export-training", str(tmp_path / "t.tsv")]
    assert main(args) == 2
    assert "a NegCLIP --export-training table needs (image, caption) pairs" in capsys.readouterr().err
    assert work == [] and not list(tmp_path.rglob("shard-*.arrow"))


def test_an_empty_corpus_file_is_one_line_naming_it(world, tmp_path, capsys):
    """An embeddings file with no rows (written the obvious way its columns are typed null: it said "column
    'kind' is null, expected strings"), and an empty listing (it mined nothing and exited 0)."""
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.table({"kind": [], "id": [], "embedding": []}), empty)
    rng = np.random.default_rng(0)
    full = tmp_path / "full.parquet"
    pq.write_table(pa.table({"kind": ["text"] * 3, "id": ["a", "b", "c"],
                             "embedding": rng.standard_normal((3, 4)).tolist()}), full)
    listing = tmp_path / "listing.parquet"
    pq.write_table(pa.table({"id": pa.array([], pa.string()), "text": pa.array([], pa.string())}), listing)
    for corpus, message in ((empty, f"{empty}: holds no rows (an empty file); an embeddings file needs one row per "
                                    f"item with kind"),
                            (listing, f"corpus {listing} (parquet) holds no texts: it is empty; pass a corpus input "
                                      f"with at least one text")):
        assert main(["mine", "--corpus", str(corpus), "--queries", str(full), "--direction", "t2t", "--out",
                     str(tmp_path / "out"), "--quiet"]) == 3
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out" / "summary.json").exists()
    assert main(["eval", "--embeddings", str(empty), "--suite", "karpathy", "--annotations", str(world["ann"]),
                 "--out", str(tmp_path / "e"), "--quiet"]) == 3
    assert "holds no rows (an empty file)" in capsys.readouterr().err


_BENCH_WRAPPER = r"""
import sys, time
import hardrank.jobs.bench.naive as naive

get = naive._ImageList.__getitem__
def slow(self, i):  # in the DataLoader workers: the naive pass is under way, and stays so
    print("HR-TEST naive decoding", file=sys.stderr, flush=True)
    time.sleep(0.5)
    return get(self, i)
naive._ImageList.__getitem__ = slow
from hardrank.jobs.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_bench_pipeline_stopped_by_a_group_sigterm_is_one_line_143(world, tmp_path):
    """SIGTERM to the whole process group (Slurm, systemd, `timeout`) during the naive pass reaches its
    DataLoader workers too: they died of it and torch raised their deaths into the cleanup, a 100-line
    traceback exiting 1. Now the workers leave the stop to the parent: one line, 143, no worker left."""
    log = tmp_path / "bench.log"
    args = ["bench", "pipeline", "--model", world["cfg"], "--checkpoint", world["ckpts"][0], "--suite", "karpathy",
            "--annotations", world["ann"], "--images", world["images"], "--naive-workers", "2", "--batch-size", "2",
            "--out", tmp_path / "bench"]
    proc = subprocess.Popen([sys.executable, "-c", _BENCH_WRAPPER, *map(str, args)], stdout=subprocess.DEVNULL,
                            stderr=open(log, "w"), start_new_session=True)
    try:
        _wait_for(log, "HR-TEST naive decoding", proc, timeout=300)
        workers = [int(p) for t in Path(f"/proc/{proc.pid}/task").iterdir()
                   for p in (t / "children").read_text().split()]
        assert len(workers) >= 2, workers
        for w in workers:  # the group's SIGTERM, reaching the workers a moment before their parent
            os.kill(w, signal.SIGTERM)
        time.sleep(1)
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(120) == 143
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:  # the workers end with their parent
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            raise AssertionError("a DataLoader worker outlived the command")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    err = [line for line in log.read_text().splitlines() if not line.startswith("HR-TEST")]
    assert "Traceback" not in "\n".join(err), "\n".join(err)[-3000:]
    assert err[-1].startswith("hardrank: terminated (SIGTERM)") and sum("hardrank:" in e for e in err) == 1


def test_an_object_that_is_no_model_given_to_the_api_is_refused_in_one_short_line(tmp_path):
    """`hardrank.evaluate(model=<a torch module>)` printed the module's whole repr (45 lines for a ViT). Model
    objects are taken now (tests/test_in_memory.py); an object of no model kind is refused on one line naming its
    type and the model objects taken, and an object given as a checkpoint as before, with the option's help."""
    import hardrank
    from hardrank.errors import UsageError

    model = torch.nn.Sequential(*[torch.nn.Linear(4, 4) for _ in range(40)])
    for kw, parts in (({"model": model}, ("option 'model' got Sequential (a torch.nn.modules.container.Sequential "
                                          "object), which is no model", "an open_clip model (with tokenizer=",
                                          "a transformers dual encoder such as CLIPModel (with processor=")),
                      ({"checkpoints": [model]}, ("option 'checkpoints' must be a", "got Sequential (a torch.nn."
                                                  "modules.container.Sequential object)", "; checkpoints: "))):
        with pytest.raises(UsageError) as e:
            hardrank.evaluate(suites=["toy"], out=str(tmp_path / "out"), **kw)
        msg = str(e.value)
        assert len(msg.splitlines()) == 1 and len(msg) < 400 and "Linear" not in msg, msg
        assert msg.startswith(parts[0]) and all(p in msg for p in parts[1:]), msg
    assert not (tmp_path / "out").exists()


# -- the store's compatibility rule: read what can be read, refuse what cannot, never destroy ----------------
def _legacy_store():
    """hardrank's store module of commit e619070, the layout before shards carried checksums (tests/legacy)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("store_e619070", Path(__file__).parent / "legacy" /
                                                  "store_e619070.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_store_of_the_previous_layout_is_read_as_it_is(world, tmp_path, capsys):
    """A store written by the code of the layout before checksums (e619070's writer, run here) serves every
    embedding it holds: nothing is encoded again, no shard is moved, and the metrics are those of the run
    that filled it."""
    from hardrank.store.embedding_store import open_store

    store = tmp_path / "store"
    assert main(_eval(world, tmp_path / "first", store)) == 0
    first = _result(tmp_path / "first")
    folder = store / first["model_fingerprint"]
    now = open_store(folder)
    rows = {m: (now.keys(m), now.read(m, now.keys(m))) for m in ("image", "text")}
    meta, dim, dtype = now.meta, now.dim, now.dtype
    shutil.rmtree(folder)
    old = _legacy_store().EmbeddingStore(store, folder.name, dim=dim, dtype=dtype, meta=meta)
    for modality, (keys, emb) in rows.items():
        old.write(modality, keys, emb)
    shards = {k: v for k, v in _files(folder).items() if k.startswith(("image/", "text/"))}
    assert len(shards) == 2 and all(b"hardrank_digest" not in data for data in shards.values())  # the old layout
    assert main(_eval(world, tmp_path / "again", store)) == 0
    again = _result(tmp_path / "again")
    assert again["metrics"] == first["metrics"] and again["model_fingerprint"] == folder.name
    assert again["provenance"]["embed"]["image"]["encoded"] == again["provenance"]["embed"]["text"]["encoded"] == 0
    assert {k: v for k, v in _files(folder).items() if k.startswith(("image/", "text/"))} == shards  # none moved
    assert not (folder / "quarantine").exists() and "Traceback" not in capsys.readouterr().err
    for modality, (keys, emb) in rows.items():
        assert np.array_equal(open_store(folder).read(modality, keys), emb)


@pytest.mark.parametrize("where", ["manifest", "shards"])
def test_a_store_of_a_newer_format_is_refused_in_one_line_and_left_as_it_is(world, tmp_path, capsys, monkeypatch,
                                                                             where):
    """A store a newer hardrank wrote (the writer with its format version raised: manifest and shards say 2)
    was taken without a word; its shards, when they failed a check of this version, were quarantined and
    encoded again. Now every command refuses it when the folder (or, the manifest gone, a shard) is opened:
    one line naming the folder, its version, the versions read here and the fix; not a file moved or written."""
    from hardrank.store import embedding_store

    store = tmp_path / "store"
    monkeypatch.setattr(embedding_store, "SCHEMA_VERSION", 2)
    monkeypatch.setattr(embedding_store, "READS", (1, 2), raising=False)  # the newer one reads it
    assert main(_eval(world, tmp_path / "newer", store)) == 0
    monkeypatch.undo()
    folder = store / _result(tmp_path / "newer")["model_fingerprint"]
    if where == "shards":
        (folder / "manifest.json").unlink()
    before = _files(store)
    capsys.readouterr()
    what = "manifest.json" if where == "manifest" else "shard image/shard-"
    for args in (_eval(world, tmp_path / "again", store), _mine(world, tmp_path / "mined", store),
                 ["store", "export", str(folder), "--suite", "karpathy", "--annotations", str(world["ann"]),
                  "--images", str(world["images"]), "--out", str(tmp_path / "e.parquet")]):
        assert main(args) == 3, args
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "Traceback" not in err, err
        assert f"store folder {folder}: {what}" in err and "store format version 2, written by a newer hardrank; " \
               "this one reads version 1: upgrade hardrank to use these embeddings, or pass another --store" in err
    assert _files(store) == before  # every file as it was: nothing moved, rewritten or quarantined
    assert not list(tmp_path.glob("again/**/karpathy.json")) and not (tmp_path / "e.parquet").exists()
    if where == "manifest":
        assert main(["store", "list", str(store)]) == 0
        assert "(store format version 2: not readable by this hardrank, left as it is)" in capsys.readouterr().out


def test_the_naive_loaders_fd_sharing_thread_is_quiet_about_a_worker_gone_mid_handshake(capsys):
    """The bench's naive DataLoader: a connection error in multiprocessing's fd-sharing server loop (a worker that
    ended mid-handshake while the command stops; the loop reports through sys.excepthook) prints nothing; any
    other error still does."""
    from hardrank.jobs.bench.naive import _quiet_fd_sharing

    seen = []
    hook = _quiet_fd_sharing(lambda t, e, tb: seen.append(e))

    def fail(exc, where):
        namespace = {}
        exec(compile("def serve():\n    raise exc\n", where, "exec"), {"exc": exc}, namespace)
        try:
            namespace["serve"]()
        except BaseException as e:
            return type(e), e, e.__traceback__

    hook(*fail(ConnectionResetError(104, "reset"), "/usr/lib/python3.11/multiprocessing/resource_sharer.py"))
    assert seen == []
    other = fail(ConnectionResetError(104, "reset"), "/work/engine/somewhere.py")
    hook(*other)
    assert seen == [other[1]]
    elsewhere = fail(ValueError("a bug"), "/usr/lib/python3.11/multiprocessing/resource_sharer.py")
    hook(*elsewhere)
    assert seen == [other[1], elsewhere[1]]
