import json

import pytest

from hardrank.formats.karpathy import read_karpathy, read_rococo_variant
from hardrank.items import Tables
from hardrank.suites import SuiteFormatError, SuiteOptions, load_suites


def test_real_rococo_counts(rococo_dir, tmp_path):
    tables = Tables.empty()
    (suite,) = load_suites(["rococo"], tables, SuiteOptions(annotations=str(rococo_dir), images=str(tmp_path)))
    i2t, t2i = suite.ranking
    assert i2t.num_queries == 5000
    assert i2t.view_size("original") == 25010
    for v in ("same_concept", "diff_concept", "rand_voca", "danger"):
        assert i2t.view_size(v) == 50010
    assert t2i.num_queries == 25010 and t2i.view_size("original") == 5000
    six = [q for q in range(5000) if i2t.pos_ptr[q + 1] - i2t.pos_ptr[q] == 6]
    assert len(six) == 10
    # ground truth = the originals only, and they are the image's own captions
    clean = read_karpathy(rococo_dir / "coco_karpathy_test.json")
    q = six[0]
    pos = i2t.pos_idx[i2t.pos_ptr[q]:i2t.pos_ptr[q + 1]]
    assert [i2t.gallery_ids[p] for p in pos] == clean[q][1]
    assert (pos < 25010).all()
    # identical normalised texts share one table row (encoded once)
    assert len(tables.texts) < 125010


def test_real_rococo_with_image_variants(rococo_dir, tmp_path):
    for v in ("mix_0.9_s1", "mix_0.9_s10", "patch_0.9_s1", "patch_0.9_s10"):
        (tmp_path / v).mkdir()
    tables = Tables.empty()
    (suite,) = load_suites(["rococo"], tables, SuiteOptions(
        annotations=str(rococo_dir), images=str(tmp_path), image_variants=("mix_0.9", "patch_0.9"), seeds=(1, 10)))
    t2i = suite.ranking[1]
    assert t2i.groups == ["original", "mix_0.9_s1", "mix_0.9_s10", "patch_0.9_s1", "patch_0.9_s10"]
    assert all(t2i.view_size(v) == 10000 for v in t2i.views if v != "original")
    assert suite.view_average == {"mix_0.9": ["mix_0.9_s1", "mix_0.9_s10"],
                                  "patch_0.9": ["patch_0.9_s1", "patch_0.9_s10"]}
    assert t2i.gallery_ids[5000].startswith("mix_0.9_s1/val2014/")
    assert len(tables.images) == 25000


def test_missing_image_variant_folder_is_a_clear_error(rococo_dir, tmp_path):
    (suite,) = load_suites(["rococo"], Tables.empty(), SuiteOptions(annotations=str(rococo_dir), images=str(tmp_path),
                                                                    image_variants=("mix_0.9",)))
    with pytest.raises(FileNotFoundError, match="hardrank perturb images"):  # when a model is to read them
        suite.check_images()


def _write(path, obj):
    path.write_text(json.dumps(obj))
    return path


def test_variant_prefix_mismatch_names_image_index(tmp_path):
    clean = [("a.jpg", ["c1", "c2"]), ("b.jpg", ["d1", "d2"])]
    bad = _write(tmp_path / "same_concept.json", [
        {"image": "a.jpg", "caption": ["c1", "c2", "p1", "p2"]},
        {"image": "b.jpg", "caption": ["d1", "XX", "p1", "p2"]}])
    with pytest.raises(SuiteFormatError, match=r"image 1 \(b.jpg\): caption 1 does not equal"):
        read_rococo_variant(bad, clean)
    short = _write(tmp_path / "rand_voca.json", [
        {"image": "a.jpg", "caption": ["c1", "c2", "p1"]}, {"image": "b.jpg", "caption": ["d1", "d2", "p1", "p2"]}])
    with pytest.raises(SuiteFormatError, match="image 0 .* has 1 perturbed captions"):
        read_rococo_variant(short, clean)
    wrong_len = _write(tmp_path / "danger.json", [{"image": "a.jpg", "caption": ["c1"]}])
    with pytest.raises(SuiteFormatError, match="has 1 images, the clean file has 2"):
        read_rococo_variant(wrong_len, clean)


def test_karpathy_format_errors(tmp_path):
    with pytest.raises(SuiteFormatError, match="item 1 lacks key"):
        read_karpathy(_write(tmp_path / "k.json", [{"image": "a", "caption": ["x"]}, {"img": "b"}]))
    with pytest.raises(SuiteFormatError, match="expected a JSON list"):
        read_karpathy(_write(tmp_path / "k2.json", {"image": "a"}))
    (tmp_path / "k3.json").write_text("{not json")
    with pytest.raises(SuiteFormatError, match="not valid JSON"):
        read_karpathy(tmp_path / "k3.json")


@pytest.mark.parametrize("suite", ["karpathy", "rococo", "coco_order"])
def test_an_image_listed_twice_is_one_image_with_the_captions_of_both_entries(tmp_path, suite, caplog):
    """BLIP's and RoCOCO's dataset code would make each listing a gallery item of its own (the copies then
    compete: R@1 drops); hardrank merges the entries at the first one, warns and records it."""
    clean = [("a.jpg", ["a one", "a two"]), ("b.jpg", ["b one", "b two", "b three"]), ("c.jpg", ["c one"]),
             ("a.jpg", ["a three"])]
    merged = [("a.jpg", ["a one", "a two", "a three"]), ("b.jpg", ["b one", "b two", "b three"]),
              ("c.jpg", ["c one"])]

    def files(folder, entries):
        folder.mkdir()
        _write(folder / "coco_karpathy_test.json", [{"image": im, "caption": caps} for im, caps in entries])
        _write(folder / "same_concept.json", [{"image": im, "caption": caps + [f"{c} x" for c in caps[:5]]}
                                              for im, caps in entries])
        for v in ("mix_0.9_s1",):
            (tmp_path / "images" / v).mkdir(parents=True, exist_ok=True)
        return SuiteOptions(annotations=str(folder), images=str(tmp_path / "images"), image_variants=("mix_0.9",),
                            seeds=(1,), text_variants=("same_concept",) if suite == "rococo" else None)

    with caplog.at_level("WARNING", logger="hardrank.suites"):
        (got,) = load_suites([suite], Tables.empty(), files(tmp_path / "twice", clean))
    assert "1 image(s) listed more than once (e.g. 'a.jpg' at entries [0, 3])" in caplog.text
    assert got.meta["repeated_images"] == {"images": 1, "entries": 4, "examples": {"a.jpg": [0, 3]}}
    caplog.clear()
    (want,) = load_suites([suite], Tables.empty(), files(tmp_path / "once", merged))
    assert not caplog.text and "repeated_images" not in want.meta
    if suite == "coco_order":
        assert got.choice[0].ids == want.choice[0].ids == [f"{im}#{j}" for im, caps in merged for j in range(len(caps))]
        return
    for g, w in zip(got.ranking, want.ranking):
        assert g.query_ids == w.query_ids and g.gallery_ids == w.gallery_ids and g.groups == w.groups
        assert g.pos_ptr.tolist() == w.pos_ptr.tolist() and g.pos_idx.tolist() == w.pos_idx.tolist()
        assert g.group_bounds.tolist() == w.group_bounds.tolist()
    i2t, t2i = got.ranking
    assert i2t.query_ids == ["a.jpg", "b.jpg", "c.jpg"]
    assert t2i.gallery_ids.count("a.jpg") == 1 and (suite == "karpathy" or "mix_0.9_s1/a.jpg" in t2i.gallery_ids)
