"""Toy world: determinism, the real suites' file formats, counts, and the toy checkpoints."""

import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hardrank.formats.variants import TEXT_VARIANTS
from hardrank.toyworld import WorldConfig, build_world
from hardrank.toyworld.scenes import BACKGROUNDS, COLOURS, SHAPES, SIZES
from hardrank.toyworld.variants import DANGER_WORDS, OTHER_CONCEPT, RANDOM_VOCAB

SMALL = WorldConfig(n_train=50, n_test=40, n_inpaint=12)
CHECKPOINTS = Path(__file__).resolve().parent.parent / "engine" / "assets" / "toy_checkpoints"


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    return build_world(tmp_path_factory.mktemp("w") / "world", SMALL)


def _load(world: Path, rel: str):
    return json.loads((world / rel).read_text(encoding="utf-8"))


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _diff_words(a: str, b: str) -> list[tuple[str, str]]:
    wa, wb = a.split(" "), b.split(" ")
    assert len(wa) == len(wb), (a, b)
    return [(x, y) for x, y in zip(wa, wb) if x != y]


def test_deterministic_for_a_seed(world, tmp_path):
    again = build_world(tmp_path / "again", SMALL)
    assert _files(again) == _files(world)
    other = build_world(tmp_path / "other", WorldConfig(seed=1, n_train=50, n_test=40, n_inpaint=12))
    assert _load(other, "karpathy_test.json") != _load(world, "karpathy_test.json")
    assert (other / "images/test/toy_000000.jpg").read_bytes() != (world / "images/test/toy_000000.jpg").read_bytes()


def test_idempotent_and_rebuilds_on_config_change(tmp_path):
    cfg = WorldConfig(n_train=5, n_test=12, n_inpaint=3, alter_methods=("mix",))
    out = build_world(tmp_path / "w", cfg)
    stamp = (out / "world.json").stat().st_mtime_ns
    assert build_world(out, cfg) == out and (out / "world.json").stat().st_mtime_ns == stamp
    cfg2 = WorldConfig(n_train=5, n_test=14, n_inpaint=3, alter_methods=("mix",))
    build_world(out, cfg2)
    assert len(_load(out, "karpathy_test.json")) == 14
    assert sorted(p.name for p in tmp_path.iterdir()) == ["w"]  # no tmp/old folders left behind


def test_refuses_a_foreign_folder(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("x")
    with pytest.raises(ValueError, match="not a toy world"):
        build_world(tmp_path / "mine", SMALL)


def test_config_validation():
    with pytest.raises(ValueError, match="n_test must be an int >= 1"):
        WorldConfig(n_test=0)
    with pytest.raises(ValueError, match="exceeds the 2016 distinct scenes"):
        WorldConfig(n_test=5000)
    with pytest.raises(ValueError, match="alter_methods"):
        WorldConfig(alter_methods=["mix"])
    with pytest.raises(ValueError, match="unknown WorldConfig keys"):
        WorldConfig.from_json({"seed": 0, "n_tset": 3})
    assert WorldConfig.from_json(SMALL.to_json()) == SMALL


def test_manifest_and_counts(world):
    m = _load(world, "world.json")
    assert m["config"] == SMALL.to_json() and m["version"] >= 1
    train, test = _load(world, "karpathy_train.json"), _load(world, "karpathy_test.json")
    assert len(train) == 50 and len(test) == 40
    assert [it["image"] for it in test] == [f"test/toy_{i:06d}.jpg" for i in range(40)]
    assert all(len(it["caption"]) == 5 for it in train)
    n_caps = Counter(len(it["caption"]) for it in test)
    assert n_caps == {5: 39, 6: 1}  # ~1% get a sixth caption, at least one
    assert m["counts"]["test_captions"] == 201 and m["counts"]["test_images_with_6_captions"] == 1
    for it in train + test:
        assert len(set(it["caption"])) == len(it["caption"])
        with Image.open(world / "images" / it["image"]) as im:
            assert im.format == "JPEG" and im.size == (64, 64) and im.mode == "RGB"
    # distinct scenes: no caption is shared by two test images
    owners = {}
    for i, it in enumerate(test):
        for c in it["caption"]:
            assert owners.setdefault(c, i) == i
    assert {a["method"] for a in m["alterations"]} == {"mix", "patch"}
    assert all(a["images"] == 40 and 0 <= a["self_pairs"] <= 40 for a in m["alterations"])


def test_vocabulary_is_rich():
    assert len(COLOURS) >= 6 and set(SHAPES) >= {"circle", "square", "triangle"} and set(SIZES) == {"small", "large"}
    assert not set(BACKGROUNDS) & set(COLOURS)


@pytest.mark.parametrize("variant", TEXT_VARIANTS)
def test_rococo_files(world, variant):
    clean = _load(world, "karpathy_test.json")
    text = (world / "rococo" / f"{variant}.json").read_text(encoding="utf-8")
    assert text.startswith('[{"image": "test/toy_000000.jpg", "caption": ["')  # the released files' layout
    items = json.loads(text)
    assert [it["image"] for it in items] == [it["image"] for it in clean]
    allowed = {"same_concept": set(COLOURS) | set(SHAPES), "diff_concept": set(OTHER_CONCEPT),
               "rand_voca": set(RANDOM_VOCAB), "danger": set(DANGER_WORDS)}[variant]
    for c, it in zip(clean, items):
        n = len(c["caption"])
        assert it["caption"][:n] == c["caption"]  # originals first, unchanged
        perturbed = it["caption"][n:]
        assert len(perturbed) == 5  # one per original 1..5; a sixth original gets none
        for orig, p in zip(c["caption"], perturbed):
            (old, new), = _diff_words(orig, p)  # exactly one word replaced
            assert new in allowed
            if variant == "same_concept":
                assert (old in COLOURS) == (new in COLOURS)  # within the same concept class
            else:
                assert old in set(COLOURS) | set(SHAPES) | set(SIZES) | set(BACKGROUNDS) | {"left", "right"}


def test_rococo_variants_are_seeded(world, tmp_path):
    other = build_world(tmp_path / "o", WorldConfig(seed=3, n_train=50, n_test=40, n_inpaint=12))
    assert _load(other, "rococo/danger.json") != _load(world, "rococo/danger.json")


def test_altered_images(world):
    test = _load(world, "karpathy_test.json")
    for variant in ("mix_0.9_s1", "patch_0.9_s1"):
        for it in test:
            with Image.open(world / "images" / variant / it["image"]) as im:
                assert im.size == (64, 64)
    a = np.asarray(Image.open(world / "images" / "test/toy_000003.jpg"), dtype=float)
    b = np.asarray(Image.open(world / "images" / "mix_0.9_s1/test/toy_000003.jpg"), dtype=float)
    assert np.abs(a - b).mean() < 30  # 90% of the original


@pytest.mark.parametrize("name", ["toy_swap", "toy_replace"])
def test_hard_positive_pairs(world, name):
    data = _load(world, f"hard_positives/data/{name}.json")
    swapped = _load(world, f"hard_positives/swapped_data/{name}.json")
    assert len(data) == len(swapped) == 40
    for i, (a, b) in enumerate(zip(data, swapped)):
        assert set(a) == set(b) == {"image_id", "true_caption", "false_caption", "image_path"}
        assert a["image_path"] == b["image_path"] == f"test/toy_{i:06d}.jpg"
        assert a["image_id"] == b["image_id"] == str(i)
        assert a["false_caption"] == b["false_caption"]
        c, c_p, c_n = a["true_caption"], b["true_caption"], a["false_caption"]
        assert len({c, c_p, c_n}) == 3
        assert Counter(c_p.split()) - Counter(["to", "the", "right", "of"]) == \
            Counter(c.split()) - Counter(["to", "the", "left", "of"])  # the same objects, other side
        if name == "toy_swap":
            assert Counter(c_n.split()) == Counter(c.split()) and len(_diff_words(c, c_n)) == 2
        else:
            assert len(_diff_words(c, c_n)) == 1
        assert (world / "images" / a["image_path"]).is_file()


def test_inpaint_parquet(world):
    import pyarrow as pa
    import pyarrow.parquet as pq

    t = pq.read_table(world / "inpaint" / "test-00000-of-00001.parquet")
    assert t.column_names == ["concept", "coco_caption", "coco_image", "inpaint_caption", "inpaint_image", "mask",
                              "worker", "coco_details", "inpaint_details"]
    img = pa.struct([("bytes", pa.binary()), ("path", pa.string())])
    for col in ("coco_image", "inpaint_image", "mask"):
        assert t.schema.field(col).type == img
    for col in ("concept", "coco_caption", "inpaint_caption", "worker"):
        assert t.schema.field(col).type == pa.string()
    assert pa.types.is_struct(t.schema.field("coco_details").type)
    assert pa.types.is_struct(t.schema.field("inpaint_details").type)
    assert t.num_rows == 12
    rows = t.to_pylist()
    assert Counter(r["concept"] for r in rows) == {"color": 4, "object": 4, "size": 4}
    assert sum(r["inpaint_caption"] == "" for r in rows) == 2
    role = {"color": set(COLOURS), "object": set(SHAPES), "size": set(SIZES)}
    for r in rows:
        ims = [Image.open(io.BytesIO(r[k]["bytes"])) for k in ("coco_image", "inpaint_image", "mask")]
        assert [im.size for im in ims] == [(64, 64)] * 3
        a, b = (np.asarray(im.convert("RGB"), dtype=float) for im in ims[:2])
        changed = np.abs(a - b).max(axis=2) > 40  # (64, 64)
        m = np.asarray(ims[2]) > 0
        assert changed.sum() > 0 and not (changed & ~m).any()  # the edit lies inside the mask
        d = r["inpaint_details"]
        if r["inpaint_caption"]:
            (old, new), = _diff_words(r["coco_caption"], r["inpaint_caption"])
            assert old in role[r["concept"]] and new in role[r["concept"]]
            assert (old, new) == (d["before"], d["after"])
        assert r["coco_image"]["bytes"] == (world / "images" / r["coco_details"]["coco_url"]).read_bytes()


def test_recall_at_k_matches_brute_force():
    from hardrank.toyworld.train import recall_at_k

    rng = np.random.default_rng(0)
    img = rng.normal(size=(7, 4)).round(1)
    txt = rng.normal(size=(16, 4)).round(1)
    txt[3] = txt[5]  # a tie
    txt_img = np.array([0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 6, 0])
    got = recall_at_k(img, txt, txt_img, ks=(1, 2, 5))
    s = img @ txt.T
    i2t = [min(sum(s[i, j] >= s[i, p] for j in range(16) if txt_img[j] != i) for p in range(16) if txt_img[p] == i)
           for i in range(7)]
    t2i = [sum(s[k, t] >= s[txt_img[t], t] for k in range(7) if k != txt_img[t]) for t in range(16)]
    for k in (1, 2, 5):
        assert got["i2t"][f"R@{k}"] == pytest.approx(100 * np.mean(np.array(i2t) < k))
        assert got["t2i"][f"R@{k}"] == pytest.approx(100 * np.mean(np.array(t2i) < k))


def test_train_smoke(world, tmp_path):
    import torch
    from safetensors.torch import load_file

    from hardrank.toyworld.train import _create, evaluate_checkpoints, train_toy

    torch.manual_seed(1)
    paths = train_toy(world, tmp_path, steps=(0, 2), batch_size=8, threads=None)
    after = torch.rand(2)
    torch.manual_seed(1)
    assert torch.equal(torch.rand(2), after)  # the global RNG state is left as it was
    assert [p.name for p in paths] == ["toy-clip_step0000.safetensors", "toy-clip_step0002.safetensors"]
    a, b = load_file(str(paths[0])), load_file(str(paths[1]))
    assert all(v.dtype == torch.float16 for v in a.values())
    assert any(not torch.equal(a[k], b[k]) for k in a)
    model, _, _ = _create()
    model.load_state_dict({k: v.float() for k, v in a.items()})
    r, = evaluate_checkpoints(paths[1:], world)
    assert set(r) == {"i2t", "t2i"} and 0 <= r["i2t"]["R@1"] <= 100
    with pytest.raises(ValueError, match="steps must start at 0"):
        train_toy(world, tmp_path, steps=(5, 10))


def test_committed_checkpoints():
    import torch
    from safetensors import safe_open

    from hardrank.toyworld.train import _create

    files = sorted(CHECKPOINTS.glob("toy-clip_step*.safetensors"))
    assert len(files) >= 4 and files[0].name == "toy-clip_step0000.safetensors"
    assert all(f.stat().st_size < 5e6 for f in files) and sum(f.stat().st_size for f in files) <= 30e6
    model, _, _ = _create()
    keys = set(model.state_dict())
    with safe_open(str(files[-1]), "pt") as f:
        assert set(f.keys()) == keys and f.metadata()["model"] == "toy-clip"
        assert f.get_tensor("logit_scale").dtype == torch.float16
