"""Data where it lives: WebDataset shards, img2dataset layouts, fsspec URLs on a real S3 server, --key-by id."""
from __future__ import annotations

import io
import json
import logging
import os
import tarfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from helpers import make_karpathy_world, save_random_checkpoint, write_tiny_config, write_wds_shards

import hardrank
from hardrank import urls
from hardrank.errors import DataError, MissingExtra, UsageError
from hardrank.inputs import read_samples
from hardrank.inputs.convert import write_karpathy_shards
from hardrank.jobs.cli import main
from hardrank.store.idkeys import IDS_FOLDER

pytest.importorskip("webdataset")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    d = tmp_path_factory.mktemp("model")
    cfg = write_tiny_config(d)
    return str(cfg), str(save_random_checkpoint(cfg, d / "c.safetensors", 0))


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    w = make_karpathy_world(tmp_path_factory.mktemp("kw") / "w", n_images=12, variants=(), image_variants=())
    w["file"] = str(w["annotations"] / "coco_karpathy_test.json")
    return w


def _eval(model, out, **kw):
    cfg, ck = model
    return hardrank.evaluate(model=cfg, checkpoints=[ck], out=str(out), device="cpu", **kw)


def _metrics(report):
    return [r["metrics"] for r in report.results]


# -- shard patterns ----------------------------------------------------------------------------------------
def test_brace_expansion_and_its_typos():
    assert urls.brace_expand("s/{00000..00002}.tar") == ["s/00000.tar", "s/00001.tar", "s/00002.tar"]
    assert urls.brace_expand("{a,b}-{8..10}") == ["a-8", "a-9", "a-10", "b-8", "b-9", "b-10"]
    with pytest.raises(UsageError, match=r"did you mean \{0\.\.3\}"):
        urls.brace_expand("s/{0...3}.tar")
    with pytest.raises(UsageError, match="never closed"):
        urls.brace_expand("s/{00000..00003.tar")
    with pytest.raises(UsageError, match="closes no"):
        urls.brace_expand("s/00000..00003}.tar")


def test_shard_writer_names_what_it_wrote(tmp_path, world):
    """One shard is named as its file (a '{00000..00000}' range reads oddly); several as a range that
    expands to exactly the files written."""
    one = write_karpathy_shards(world["file"], str(world["images"]), str(tmp_path / "one"), per_shard=100)
    assert one == str(tmp_path / "one" / "00000.tar") and os.path.isfile(one)
    many = write_karpathy_shards(world["file"], str(world["images"]), str(tmp_path / "many"), per_shard=5)
    assert many == str(tmp_path / "many" / "{00000..00002}.tar")
    assert sorted(os.listdir(tmp_path / "many")) == ["00000.tar", "00001.tar", "00002.tar"]
    assert [(len(r.samples), len(r.shards)) for r in map(read_samples, (one, many))] == [(12, 1), (12, 3)]


def test_shard_writer_writes_an_image_listed_twice_as_one_sample(tmp_path, world):
    """As the suites score it: one sample per image, holding the captions of all its entries."""
    entries = [dict(it) for it in world["clean"]]
    entries.append({"image": entries[4]["image"], "caption": ["listed again"]})
    f = tmp_path / "twice.json"
    f.write_text(json.dumps(entries))
    ss = read_samples(write_karpathy_shards(str(f), str(world["images"]), str(tmp_path / "s"), per_shard=100))
    assert len(ss.samples) == 12
    assert ss.samples[4].texts["txt"].splitlines() == [*world["clean"][4]["caption"], "listed again"]


def test_a_range_naming_missing_shards_says_which(tmp_path, world):
    pat = write_wds_shards(world["clean"], world["images"], tmp_path / "s", per_shard=5)  # 3 shards: 0..2
    with pytest.raises(FileNotFoundError, match=r"1 of 4 files do not exist.*00003\.tar"):
        read_samples(pat.replace("00002", "00003"))


def test_unknown_protocol_and_missing_backend_name_the_fix():
    with pytest.raises(UsageError, match="unknown protocol 'foo'"):
        urls.read_bytes("foo://bucket/x.tar")
    with pytest.raises(MissingExtra, match="gcsfs"):  # not installed here: the message names the package
        urls.read_bytes("gs://bucket/x.tar")


def _closed_port() -> int:
    import socket

    with socket.socket() as sock:  # a port nothing listens on once closed
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_an_unreachable_server_is_named_with_the_fix(tmp_path, monkeypatch):
    pytest.importorskip("s3fs")
    import s3fs

    port = _closed_port()
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "a")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "b")
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    s3fs.S3FileSystem.clear_instance_cache()
    try:
        with pytest.raises(DataError, match=rf"s3://b/00000.tar: cannot reach the server.*AWS_ENDPOINT_URL is "
                                            rf"'http://127.0.0.1:{port}': is that server running\?"):
            urls.expand("s3://b/{00000..00001}.tar")
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
    pytest.importorskip("aiohttp")
    with pytest.raises(DataError, match=rf"http://127.0.0.1:{port}/x.tar: cannot reach the server"):
        urls.expand(f"http://127.0.0.1:{port}/x.tar")
    with pytest.raises(FileNotFoundError, match=r"do not exist.*check the name"):  # no braces: no range advice
        urls.expand(str(tmp_path / "x.tar"))


# -- WebDataset shards as a retrieval suite -----------------------------------------------------------------
def test_wds_suite_equals_the_folder_and_shares_its_store(tmp_path, model, world):
    """Shards written by the webdataset package give the metrics of the same images and captions read from
    the folder, and the same content keys: the second run takes every embedding from the store."""
    pat = write_wds_shards(world["clean"], world["images"], tmp_path / "shards", per_shard=5)
    store = tmp_path / "store"
    ref = _eval(model, tmp_path / "o1", suites=["karpathy"], annotations=world["file"], images=str(world["images"]),
                store=str(store))
    for captions in ("json:captions", "txt"):
        got = _eval(model, tmp_path / f"o-{captions}", suites=["wds"], images=pat, captions=captions,
                    store=str(store))
        assert _metrics(got) == _metrics(ref)
        assert got.embed_stats["image"]["encoded"] == 0 and got.embed_stats["image"]["from_store"] == 12
    r = got.results[0]
    assert r["suite_meta"]["layout"] == "webdataset" and r["suite_meta"]["shards"] == 3
    outcomes = pq.read_table(tmp_path / "o-txt" / "c" / "wds.parquet").to_pydict()
    i2t = [q for q, t in zip(outcomes["query_id"], outcomes["task"]) if t == "i2t"]
    assert i2t[:2] == ["00000.tar#000000000", "00000.tar#000000001"]  # human ids: shard#key


def test_corrupt_sample_is_recorded_and_a_damaged_shard_keeps_its_first_samples(tmp_path, model, world):
    pat = write_wds_shards(world["clean"], world["images"], tmp_path / "shards", per_shard=5)
    shard0 = tmp_path / "shards" / "00000.tar"
    # a sample whose image is not an image: rewrite member 000000001.jpg with garbage of the same size
    with tarfile.open(shard0) as tf:
        m = tf.getmember("000000001.jpg")
    raw = bytearray(shard0.read_bytes())
    raw[m.offset_data:m.offset_data + m.size] = b"\x00" * m.size
    shard0.write_bytes(bytes(raw))
    # a truncated last shard, cut inside the 2nd sample's first header: the sample being read when the damage
    # shows is dropped too (its last member may be the cut one), and the loss is reported
    shard2 = tmp_path / "shards" / "00002.tar"
    with tarfile.open(shard2) as tf:
        cut = tf.getmember("000000011.jpg").offset + 100
    shard2.write_bytes(shard2.read_bytes()[:cut])
    got = _eval(model, tmp_path / "o", suites=["wds"], images=pat, captions="json:captions",
                store=str(tmp_path / "s"))
    r = got.results[0]
    assert r["failed_items"] == 1 and r["failures"][0]["source"].endswith("00000.tar#000000001.jpg")
    assert "not an image" in r["failures"][0]["reason"]
    (err,) = r["suite_meta"]["shard_errors"]
    assert "00002.tar: damaged after 0 complete sample(s)" in err and "truncated header" in err
    assert "sample 000000010 and any after it are lost" in err
    assert r["suite_meta"]["samples"] == 10  # 12 written, 2 in the damaged shard lost; the bad image skipped below
    assert r["counts"]["original"]["i2t"]["queries"] == 9


def _tar(path: Path, members: list[tuple[str, bytes]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tf.addfile(info, io.BytesIO(data))
    return path


def _jpeg(world, i: int) -> bytes:
    return (world["images"] / world["clean"][i]["image"]).read_bytes()


@pytest.mark.parametrize("layout", ["apart", "adjacent", "parquet"])
def test_two_samples_with_one_key_are_refused_naming_both(tmp_path, world, model, layout):
    """Two samples of one shard under one key would be two items with one id (<shard>#<key>), and a variant
    joined by key could land on either: refused (exit 3) naming both, for eval, mine and the suite alike.
    `adjacent` (KEY.jpg twice in a row) was one sample whose first image was silently dropped."""
    a, b, c = (_jpeg(world, i) for i in range(3))
    if layout == "parquet":
        src = tmp_path / "p" / "00000.parquet"
        src.parent.mkdir()
        pq.write_table(pa.table({"key": ["k0", "k1", "k0"], "caption": ["one", "two", "three"],
                                 "status": ["success"] * 3, "jpg": [a, b, c]}), src)
        where = "00000.parquet: two samples have the key 'k0': sample 0 (image "
    else:
        order = ["k0", "k1", "k0"] if layout == "apart" else ["k0", "k0", "k1"]
        src = _tar(tmp_path / "s" / "00000.tar", [m for k, data, cap in zip(order, (a, b, c), ("one", "two", "three"))
                                                  for m in ((f"{k}.jpg", data), (f"{k}.txt", cap.encode()))])
        second = 2 if layout == "apart" else 1
        where = f"00000.tar: two samples have the key 'k0': sample 0 (image k0.jpg at byte 512) and sample {second} "
    with pytest.raises(DataError, match="re-write the (shard|file) with unique keys") as exc:
        read_samples(str(src))
    assert where in str(exc.value)
    cfg, ck = model
    common = ["--model", cfg, "--checkpoint", ck, "--device", "cpu", "--store", str(tmp_path / "st"), "--quiet"]
    assert main(["eval", "--suite", "wds", "--images", str(src), "--out", str(tmp_path / "o"), *common]) == 3
    assert main(["mine", "--corpus", str(src), "--queries", str(src), "--direction", "t2i", "-k", "1",
                 "--out", str(tmp_path / "m"), *common]) == 3


def test_keys_repeated_across_shards_join_their_own_shards_variant(tmp_path, world):
    """Keys restart in every shard (a key names a sample within its shard): each sample's altered image and
    perturbed captions come from the variant shard of its own shard, not from whichever shard was read last."""
    from hardrank.items import Tables
    from hardrank.suites import SuiteOptions, load_suites

    for v, first in (("", 0), ("mix_0.9_s1/", 6)):  # the altered images: other images, by shard and key
        for s in range(2):
            _tar(tmp_path / "s" / f"{v}0000{s}.tar", [m for i in range(2) for m in (
                (f"k{i}.jpg", _jpeg(world, first + 2 * s + i)), (f"k{i}.txt", f"shard {s} sample {i}".encode()))])
    opts = SuiteOptions(images=str(tmp_path / "s" / "{00000..00001}.tar"), image_variants=("mix_0.9",), seeds=(1,))
    tables = Tables.empty()
    (suite,) = load_suites(["wds"], tables, opts)
    i2t, t2i = suite.ranking
    assert i2t.query_ids == ["00000.tar#k0", "00000.tar#k1", "00001.tar#k0", "00001.tar#k1"]
    altered = [tables.images.entries[r].uri for r in t2i.gallery_items[t2i.group_bounds[1]:]]
    assert [u.rsplit("/", 2)[-2:] for u in altered] == [["mix_0.9_s1", f"0000{s}.tar#k{i}.jpg"]
                                                        for s in range(2) for i in range(2)]
    for s in range(2):
        _tar(tmp_path / "s" / "same_concept" / f"0000{s}.tar", [(f"k{i}.txt", (
            f"shard {s} sample {i}\nshard {s} sample {i} altered").encode()) for i in range(2)])
    (suite,) = load_suites(["wds"], Tables.empty(), opts)
    perturbed = suite.ranking[0].gallery_ids[suite.ranking[0].group_bounds[1]:]
    assert perturbed == [f"shard {s} sample {i} altered" for s in range(2) for i in range(2)]


# -- img2dataset's three layouts -------------------------------------------------------------------------
def _img2dataset_files(world, out: Path) -> None:
    """img2dataset's files layout: 00000/000000001.jpg + .txt + .json."""
    for i, item in enumerate(world["clean"]):
        stem = out / f"{i // 5:05d}" / f"{i:09d}"
        stem.parent.mkdir(parents=True, exist_ok=True)
        stem.with_suffix(".jpg").write_bytes((world["images"] / item["image"]).read_bytes())
        stem.with_suffix(".txt").write_text("\n".join(item["caption"]))
        stem.with_suffix(".json").write_text(json.dumps({"key": f"{i:09d}", "url": f"http://x/{i}.jpg",
                                                         "caption": item["caption"][0], "status": "success"}))


def _img2dataset_parquet(world, out: Path) -> None:
    """img2dataset's parquet layout, written with pyarrow: key, url, caption, status, jpg (bytes); one
    failed download (status failed_to_download, no bytes) is skipped."""
    rows = {"key": [], "url": [], "caption": [], "status": [], "error_message": [], "jpg": []}
    for i, item in enumerate(world["clean"]):
        rows["key"].append(f"{i:09d}")
        rows["url"].append(f"http://x/{i}.jpg")
        rows["caption"].append("\n".join(item["caption"]))
        rows["status"].append("success")
        rows["error_message"].append(None)
        rows["jpg"].append((world["images"] / item["image"]).read_bytes())
    for k, v in (("key", "999999999"), ("url", "http://x/gone.jpg"), ("caption", "lost"),
                 ("status", "failed_to_download"), ("error_message", "404"), ("jpg", None)):
        rows[k].append(v)
    out.mkdir(parents=True, exist_ok=True)
    schema = pa.schema([("key", pa.string()), ("url", pa.string()), ("caption", pa.string()), ("status", pa.string()),
                        ("error_message", pa.string()), ("jpg", pa.binary())])
    pq.write_table(pa.table(rows, schema=schema), out / "00000.parquet")


def test_img2dataset_layouts_equal_the_folder(tmp_path, model, world):
    store = str(tmp_path / "store")
    ref = _eval(model, tmp_path / "o0", suites=["karpathy"], annotations=world["file"], images=str(world["images"]),
                store=store)
    _img2dataset_files(world, tmp_path / "files")
    _img2dataset_parquet(world, tmp_path / "pq")
    files = _eval(model, tmp_path / "o1", suites=["wds"], images=str(tmp_path / "files"), store=store)
    parq = _eval(model, tmp_path / "o2", suites=["wds"], images=str(tmp_path / "pq" / "*.parquet"), store=store)
    assert _metrics(files) == _metrics(ref) == _metrics(parq)
    assert parq.results[0]["suite_meta"]["samples_skipped"] == {"no image": 1}
    assert files.embed_stats["image"]["from_store"] == parq.embed_stats["image"]["from_store"] == 12


# -- the toy world from s3:// ----------------------------------------------------------------------------
def test_toy_world_as_shards_on_s3_gives_the_folders_metrics(tmp_path, model, s3):
    """The acceptance test: the toy world's test split written as WebDataset shards and uploaded to a local
    S3-compatible server evaluates from s3:// (shards, store and results all remote) with the metrics of the
    folder; a rerun with --key-by id takes everything from the remote store and reads no image."""
    from hardrank.toyworld import WorldConfig, build_world

    world = Path(build_world(tmp_path / "world", WorldConfig(n_train=10, n_test=40, n_inpaint=8)))
    clean = json.loads((world / "karpathy_test.json").read_text())
    pat = write_wds_shards(clean, world / "images", tmp_path / "shards", per_shard=16)
    for f in sorted((tmp_path / "shards").glob("*.tar")):
        s3.put_file(str(f), f"bucket/toy/{f.name}")
    remote = "s3://bucket/toy/" + Path(pat).name
    ref = _eval(model, tmp_path / "folder", suites=["karpathy"], annotations=str(world / "karpathy_test.json"),
                images=str(world / "images"), store=str(tmp_path / "local-store"))
    got = _eval(model, "s3://bucket/results", suites=["wds"], images=remote, captions="json:captions",
                store="s3://bucket/store")
    assert _metrics(got) == _metrics(ref)
    remote_result = json.loads(s3.cat("bucket/results/c/wds.json"))
    assert remote_result["metrics"] == json.loads((tmp_path / "folder" / "c" / "karpathy.json").read_text())["metrics"]
    listed = s3.find("bucket/store")
    assert any("/image/shard-" in p for p in listed) and any(p.endswith("manifest.json") for p in listed)
    assert any(f"/{IDS_FOLDER}/ids-" in p for p in listed)  # identities recorded beside the shards
    assert not [p for p in listed if p.rsplit("/", 1)[-1].startswith(".")]  # no temporaries, no lock files

    # a fresh machine (empty cache) with --key-by id: hits from the remote store, no shard member read
    os.environ["HARDRANK_CACHE"] = str(tmp_path / "fresh-cache")
    reads = []
    real = urls.read_bytes
    try:
        urls.read_bytes = lambda u, start=None, end=None: (reads.append((u, start)), real(u, start, end))[1]
        again = _eval(model, tmp_path / "again", suites=["wds"], images=remote, captions="json:captions",
                      store="s3://bucket/store", key_by="id")
    finally:
        urls.read_bytes = real
    assert _metrics(again) == _metrics(ref)
    assert again.embed_stats["image"]["encoded"] == 0 and again.embed_stats["image"]["from_store"] == 40
    assert not [r for r in reads if r[1] is not None]  # no range read: no image bytes (the scan streams captions)


def test_missing_credentials_fail_before_work_naming_the_fix(tmp_path, model, world, s3, monkeypatch):
    import s3fs

    for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.setenv(k, "wrong")
    s3fs.S3FileSystem.clear_instance_cache()
    monkeypatch.setattr(s3fs.S3FileSystem, "_cache", {}, raising=False)
    try:
        # moto accepts any key: an access refusal is simulated by a bucket that does not exist
        with pytest.raises(UsageError, match=r"out \(--out\) is 's3://nobucket/r'.*cannot be written"):
            _eval(model, "s3://nobucket/r", suites=["karpathy"], annotations=world["file"],
                  images=str(world["images"]), store=str(tmp_path / "s"))
    finally:
        s3fs.S3FileSystem.clear_instance_cache()
    err = urls.remote_error("s3://b/x", type("NoCredentialsError", (Exception,), {})("Unable to locate credentials"))
    assert isinstance(err, DataError) and "AWS_ACCESS_KEY_ID" in str(err)


# -- --key-by id -------------------------------------------------------------------------------------------
def test_key_by_id_reads_no_image_to_decide_and_keys_stay_content(tmp_path, model, world, monkeypatch):
    import hardrank.items as items_mod

    store = str(tmp_path / "store")
    kw = dict(suites=["karpathy"], annotations=world["file"], images=str(world["images"]), store=store)
    first = _eval(model, tmp_path / "o1", key_by="id", **kw)  # new images: hashed by the decode stage
    assert first.embed_stats["image"]["encoded"] == 12
    reads = []
    real = items_mod.read_image_bytes
    monkeypatch.setattr(items_mod, "read_image_bytes", lambda u: (reads.append(u), real(u))[1])
    again = _eval(model, tmp_path / "o2", key_by="id", **kw)
    assert again.embed_stats["image"]["from_store"] == 12 and not reads  # decided from stat() alone
    monkeypatch.setattr(items_mod, "read_image_bytes", real)
    content = _eval(model, tmp_path / "o3", **kw)  # a content run finds the same (content) keys
    assert content.embed_stats["image"]["encoded"] == 0
    assert _metrics(first) == _metrics(again) == _metrics(content)
    # a file rewritten with other bytes is a new identity: encoded again, under its new content
    img = Path(world["images"]) / world["clean"][0]["image"]
    old = img.read_bytes()
    try:
        from helpers import write_image

        write_image(img, np.random.default_rng(99))
        changed = _eval(model, tmp_path / "o4", key_by="id", **kw)
        assert changed.embed_stats["image"]["encoded"] == 1
    finally:
        img.write_bytes(old)


def test_key_by_id_on_the_command_line_and_dry_run(tmp_path, model, world, capsys):
    cfg, ck = model
    base = ["eval", "--model", cfg, "--checkpoint", ck, "--suite", "karpathy", "--annotations", world["file"],
            "--images", str(world["images"]), "--store", str(tmp_path / "s"), "--device", "cpu", "--quiet",
            "--key-by", "id"]
    assert main([*base, "--out", str(tmp_path / "o")]) == 0
    capsys.readouterr()
    assert main([*base, "--out", str(tmp_path / "o2"), "--dry-run"]) == 0
    assert "store hits: images 12/12" in capsys.readouterr().out


def test_written_shards_read_back_with_webdataset(tmp_path):
    """Shards hardrank writes (perturb, toy shards) are plain tars the webdataset package reads."""
    import webdataset as wds
    from PIL import Image

    from hardrank.inputs import write_shard

    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (255, 0, 0)).save(buf, format="JPEG")
    write_shard(str(tmp_path / "x.tar"), [("000000000", {"jpg": buf.getvalue(), "txt": b"a red square"})])
    (s,) = list(wds.WebDataset(str(tmp_path / "x.tar"), shardshuffle=False))
    assert s["__key__"] == "000000000" and s["txt"] == b"a red square" and s["jpg"] == buf.getvalue()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]


# -- mining from shards --------------------------------------------------------------------------------
def test_mine_from_shards_equals_mining_the_karpathy_file(tmp_path, model, world, s3):
    """Captions of the shards -> their images: the same negatives (by content key, same scores) as the
    Karpathy file + image folder, with the samples' ids; shards on s3:// and --out on s3:// too."""
    cfg, ck = model
    pat = write_wds_shards(world["clean"], world["images"], tmp_path / "shards", per_shard=5)
    for f in sorted((tmp_path / "shards").glob("*.tar")):
        s3.put_file(str(f), f"bucket/mine/{f.name}")
    remote = "s3://bucket/mine/" + Path(pat).name
    common = dict(model=cfg, checkpoint=ck, direction="t2i", k=3, device="cpu", store=str(tmp_path / "store"),
                  dup_threshold=None)
    ref = hardrank.mine(queries=world["file"], corpus=world["file"], images=str(world["images"]),
                        out=str(tmp_path / "ref"), **common)
    got = hardrank.mine(queries=remote, corpus=remote, captions="json:captions", out="s3://bucket/mined", **common)
    assert got["counts"] == ref["counts"]
    a = pq.read_table(tmp_path / "ref" / "negatives").to_pydict()
    local = tmp_path / "got"
    s3.get("bucket/mined/negatives", str(local), recursive=True)
    b = pq.read_table(local).to_pydict()
    assert a["negative_key"] == b["negative_key"] and np.allclose(a["score"], b["score"])
    assert b["negative_id"][0].startswith("0000") and ".tar#" in b["negative_id"][0]
    assert s3.exists("bucket/mined/summary.json")


# -- RoCOCO on shards: perturb writes shards back, the wds suite reads them --------------------------------
def test_perturb_shards_and_rococo_on_shards_equal_the_folders(tmp_path, model, world):
    """perturb images/texts on shards write variant shards beside them; --suite wds with --image-variants and
    --text-variants gives the metrics of the same perturbations made from the folder and the Karpathy file."""
    import shutil

    cfg, ck = model
    pat = write_wds_shards(world["clean"], world["images"], tmp_path / "shards", per_shard=5)
    images = tmp_path / "images"
    shutil.copytree(world["images"], images)
    ann = tmp_path / "ann"
    m = ["--model", cfg, "--checkpoint", ck, "--device", "cpu"]
    assert main(["perturb", "images", "--method", "mix", "--images", str(images), "--annotations", world["file"],
                 "--out", str(images)]) == 0
    assert main(["perturb", "images", "--method", "mix", "--images", pat, "--out", str(tmp_path / "shards")]) == 0
    assert main(["perturb", "texts", *m, "--annotations", world["file"], "--kinds", "same_concept",
                 "--out", str(ann)]) == 0
    assert main(["perturb", "texts", *m, "--annotations", pat, "--captions", "json:captions",
                 "--kinds", "same_concept", "--out", str(tmp_path / "shards")]) == 0
    assert sorted(p.name for p in (tmp_path / "shards" / "mix_0.9_s1").iterdir()) == ["00000.tar", "00001.tar",
                                                                                       "00002.tar"]
    store = str(tmp_path / "store")
    ref = _eval(model, tmp_path / "o1", suites=["rococo"], annotations=str(ann / "coco_karpathy_test.json"),
                images=str(images), image_variants=["mix_0.9"], store=store)
    got = _eval(model, tmp_path / "o2", suites=["wds"], images=pat, captions="json:captions",
                image_variants=["mix_0.9"], store=store)
    assert set(got.results[0]["metrics"]) == {"original", "same_concept", "mix_0.9_s1"}
    assert _metrics(got) == _metrics(ref)
    assert got.embed_stats["image"]["encoded"] == 0  # the altered shards hold the folder's altered bytes
    with pytest.raises(FileNotFoundError, match=r"variant danger: shard .*danger/00000.tar does not exist"):
        _eval(model, tmp_path / "o3", suites=["wds"], images=pat, captions="json:captions", text_variants=["danger"],
              store=store)


# -- Ray: the workers read the shards --------------------------------------------------------------------
@pytest.mark.slow
def test_ray_workers_read_s3_shards_and_the_driver_reads_none(tmp_path, model, world, s3, monkeypatch):
    """--executor ray with shards on s3://: shard scans run as Ray tasks and images are read by the decode
    actors (range requests), so the driver reads no shard byte; metrics equal the local executor's, and with
    --key-by id the actors hash what they decode, so the store holds the same content keys."""
    ray = pytest.importorskip("ray")
    from hardrank.executors.ray_embed import RayRunner
    from hardrank.inputs import webdataset as wds_mod

    pat = write_wds_shards(world["clean"], world["images"], tmp_path / "shards", per_shard=5)
    for f in sorted((tmp_path / "shards").glob("*.tar")):
        s3.put_file(str(f), f"bucket/ray/{f.name}")
    remote = "s3://bucket/ray/" + Path(pat).name
    ref = _eval(model, tmp_path / "local", suites=["wds"], images=remote, captions="json:captions",
                store=str(tmp_path / "s-local"), batch_size=5)
    ray.init(num_cpus=2, include_dashboard=False, object_store_memory=256 << 20, logging_level=logging.WARNING)
    try:
        monkeypatch.setenv("HARDRANK_CACHE", str(tmp_path / "driver-cache"))  # no cached scan in the driver

        def no_read(*a, **k):
            raise AssertionError(f"the driver read shard bytes: {a}")

        monkeypatch.setattr(wds_mod, "_open_stream", no_read)
        monkeypatch.setattr(urls, "read_bytes", no_read)
        got = _eval(model, tmp_path / "ray", suites=["wds"], images=remote, captions="json:captions",
                    store=str(tmp_path / "s-ray"), batch_size=5, executor="ray", key_by="id",
                    runner=RayRunner(decode_actors=1))
    finally:
        ray.shutdown()
    assert _metrics(got) == _metrics(ref)
    assert got.embed_stats["image"]["encoded"] == 12
    local_keys = sorted(p.name for p in (tmp_path / "s-local").rglob("shard-*.arrow"))
    assert len(local_keys) == len(sorted(p.name for p in (tmp_path / "s-ray").rglob("shard-*.arrow")))
    from hardrank.store.embedding_store import open_store

    (a,) = list((tmp_path / "s-local").iterdir())
    (b,) = list((tmp_path / "s-ray").iterdir())
    assert sorted(open_store(a).keys("image")) == sorted(open_store(b).keys("image"))  # content keys either way


def test_tar_reader_handles_long_names_pax_and_a_cut_at_a_member_boundary(tmp_path):
    """Long member names (GNU and pax headers, as Python's tarfile writes them) are read; a shard cut between
    two members (no end-of-archive marker) is reported as truncated, its whole samples kept."""
    from hardrank.inputs import scan_shard

    long_key = "d" * 120 + "/000000001"
    for fmt in (tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
        path = tmp_path / f"{fmt}.tar"
        with tarfile.open(path, "w", format=fmt) as tf:
            for key, ext, data in ((long_key, "jpg", b"\xff\xd8bytes"), (long_key, "txt", "é caption".encode()),
                                   ("000000002", "jpg", b"\xff\xd8more"), ("000000002", "txt", b"two")):
                info = tarfile.TarInfo(f"{key}.{ext}")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
        scan = scan_shard(str(path), cache=False)
        assert [s.key for s in scan.samples] == [long_key, "000000002"] and scan.error is None
        assert scan.samples[0].texts["txt"] == "é caption"
        assert urls.read_source(scan.samples[1].image) == b"\xff\xd8more"
    with tarfile.open(path) as tf:
        cut = tf.getmember("000000002.jpg").offset
    (tmp_path / "cut.tar").write_bytes(path.read_bytes()[:cut])
    scan = scan_shard(str(tmp_path / "cut.tar"), cache=False)
    assert [s.key for s in scan.samples] == [] and "truncated" in scan.error  # the sample in hand is dropped too
