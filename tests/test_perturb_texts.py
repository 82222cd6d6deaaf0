import argparse
import json

import numpy as np
import pytest
import torch

from hardrank import ModelSpec, load_model
from hardrank.formats.karpathy import read_karpathy, read_rococo_variant
from hardrank.jobs.cmd_perturb import add_perturb_parser, run_perturb
from hardrank.perturb.texts import (
    DEFAULT_VOCAB,
    KINDS,
    embedding_influence,
    load_vocab,
    perturb_captions,
    write_variant_file,
)
from hardrank.suites import SuiteFormatError
from hardrank.text import pre_caption

TINY = {"embed_dim": 32,
        "vision_cfg": {"image_size": 32, "layers": 1, "width": 32, "patch_size": 16, "head_width": 16},
        "text_cfg": {"context_length": 32, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1}}

CAPTIONS = [
    "A man with a red helmet on a small moped on a dirt road.",
    "Two dogs, playing with frisbees in the grass.",
    "Several people standing next to buses on the street",
    "A woman's umbrella and a cat's tail",
    "running quickly and happily",          # no vocabulary noun: fallback
    "it is what it is",                     # stopwords only
    "Giraffe",
    "",
]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    cfg = tmp_path_factory.mktemp("cfg") / "hardrank-tiny-ptexts.json"
    cfg.write_text(json.dumps(TINY))
    torch.manual_seed(0)
    lm = load_model(ModelSpec(arch=str(cfg), checkpoint=None, device="cpu", random_init=True))
    return lm, cfg


def _slow_influence(model, tokenizer, caption):
    """One text at a time: the obviously correct twin of embedding_influence."""
    def enc(t):
        with torch.inference_mode():
            e = model.encode_text(tokenizer([t])).float()[0]
        return (e / e.norm()).numpy()
    words = pre_caption(caption).split()
    full = enc(" ".join(words))
    return np.array([1 - enc(" ".join(words[:j] + words[j + 1:])) @ full for j in range(len(words))])


@pytest.mark.parametrize("batch_size", [1, 7, 64, 10_000])
def test_batched_influence_equals_one_caption_at_a_time(tiny, batch_size):
    lm, _ = tiny
    got = embedding_influence(lm.model, lm.tokenizer, CAPTIONS, batch_size=batch_size)
    assert [len(g) for g in got] == [len(pre_caption(c).split()) for c in CAPTIONS]
    for c, g in zip(CAPTIONS, got):
        np.testing.assert_allclose(g, _slow_influence(lm.model, lm.tokenizer, c), atol=2e-6)
    assert embedding_influence(lm.model, lm.tokenizer, []) == []
    with pytest.raises(ValueError, match="batch_size must be >= 1"):
        embedding_influence(lm.model, lm.tokenizer, CAPTIONS, batch_size=0)


def _diff(orig, pert):
    a, b = pre_caption(orig).split(), pert.split()
    assert len(a) == len(b), (orig, pert)
    idx = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    assert len(idx) == 1, (orig, pert)
    return idx[0], a[idx[0]], b[idx[0]]


def _core(word):
    return word.strip(",'").removesuffix("'s")


@pytest.mark.parametrize("kind", KINDS)
def test_one_noun_replaced_by_the_kinds_source(tiny, kind):
    lm, _ = tiny
    vocab = load_vocab()
    infl = embedding_influence(lm.model, lm.tokenizer, CAPTIONS)
    out = perturb_captions(CAPTIONS, lm.model, lm.tokenizer, kind=kind, seed=3)
    assert len(out) == len(CAPTIONS)
    for c, p, f in zip(CAPTIONS[:-1], out, infl):
        i, old, new = _diff(c, p)
        assert pre_caption(p) == p
        words = pre_caption(c).split()
        nouns = [j for j, w in enumerate(words) if _core(w) in vocab.nouns]
        if not nouns:  # fallback: the lowest-influence non-stopword (or any word)
            content = [j for j, w in enumerate(words) if w not in vocab.stopwords] or list(range(len(words)))
            assert i == content[int(np.argmin(f[content]))]
            continue
        assert i == nouns[int(np.argmin(f[nouns]))]  # lowest-influence vocabulary noun
        assert old.replace(_core(old), "") == new.replace(_core(new), "")  # "dogs," keeps its comma
        o_cls, o_entry, o_plural = vocab.nouns[_core(old)]
        if kind == "rand_voca":
            assert _core(new) in vocab.random and _core(new) != _core(old)
            continue
        if kind == "danger":
            entry = next(e for e in vocab.danger if _core(new) in e)
            assert _core(old) not in entry
        else:
            n_cls, n_entry, _ = vocab.nouns[_core(new)]
            assert (n_cls == o_cls) == (kind == "same_concept")
            assert (n_cls, n_entry) != (o_cls, o_entry)
            entry = vocab.classes[n_cls][n_entry]
        assert _core(new) == (entry[-1] if o_plural else entry[0])  # singular/plural kept
    assert len(out[-1].split()) == 1  # empty caption: the replacement word alone


def test_plural_nouns_stay_plural(tiny):
    lm, _ = tiny
    vocab = load_vocab()
    caps = ["dogs", "people", "buses", "knives", "men"]
    for kind in ("same_concept", "diff_concept", "danger"):
        for c, p in zip(caps, perturb_captions(caps, lm.model, lm.tokenizer, kind=kind, seed=1)):
            entries = vocab.danger if kind == "danger" else vocab.classes[vocab.nouns[p][0]]
            e = next(e for e in entries if p in e)
            assert p == e[-1] and (len(e) == 1 or e[0] != e[1]), (kind, c, p)


def test_deterministic_per_seed_and_independent_of_order(tiny):
    lm, _ = tiny
    caps = CAPTIONS * 3
    for kind in KINDS:
        a = perturb_captions(caps, lm.model, lm.tokenizer, kind=kind, seed=1)
        assert a == perturb_captions(caps, lm.model, lm.tokenizer, kind=kind, seed=1)
        assert a[::-1] == perturb_captions(caps[::-1], lm.model, lm.tokenizer, kind=kind, seed=1)
        assert a != perturb_captions(caps, lm.model, lm.tokenizer, kind=kind, seed=2)
    with pytest.raises(ValueError, match="unknown perturbation kind 'same'"):
        perturb_captions(caps, lm.model, lm.tokenizer, kind="same", seed=1)
    with pytest.raises(ValueError, match="seed must be a non-negative integer"):
        perturb_captions(caps, lm.model, lm.tokenizer, kind="danger", seed=-1)


def test_precomputed_influence_is_reused_and_checked(tiny):
    lm, _ = tiny
    infl = dict(zip(CAPTIONS, embedding_influence(lm.model, lm.tokenizer, CAPTIONS)))
    assert perturb_captions(CAPTIONS, None, None, kind="danger", seed=1, influence=infl) == \
        perturb_captions(CAPTIONS, lm.model, lm.tokenizer, kind="danger", seed=1)
    infl[CAPTIONS[0]] = np.zeros(2)
    with pytest.raises(ValueError, match="has 2 values, the caption has 14 words"):
        perturb_captions(CAPTIONS, None, None, kind="danger", seed=1, influence=infl)


def _karpathy(path, items):
    path.write_text(json.dumps([{"image": im, "caption": caps} for im, caps in items]))
    return path


def test_variant_file_round_trips_through_read_rococo_variant(tiny, tmp_path):
    lm, _ = tiny
    six = [f"A dog number {i} on a couch." for i in range(6)]
    five = CAPTIONS[:5]
    ann = _karpathy(tmp_path / "clean.json", [("val/a.jpg", six), ("val/b.jpg", five), ("val/c.jpg", ["Cats."])])
    out = tmp_path / "out" / "same_concept.json"
    report = write_variant_file(ann, out, "same_concept", lm.model, lm.tokenizer, 1)
    assert report["images"] == 3 and report["originals"] == 12 and report["perturbed"] == 11
    assert report["fallback"] == 1  # "running quickly and happily"
    clean = read_karpathy(ann)
    pert = read_rococo_variant(out, clean)
    assert [len(p) for p in pert] == [5, 5, 1]
    for (_, caps), ps in zip(clean, pert):
        for c, p in zip(caps, ps):  # perturbed caption j comes from original j
            _diff(c, p)
    assert [p.name for p in out.parent.iterdir()] == ["same_concept.json"]  # no .tmp left behind
    before = out.read_text()
    write_variant_file(ann, out, "same_concept", lm.model, lm.tokenizer, 1)
    assert out.read_text() == before


def test_malformed_input_is_a_clear_error(tiny, tmp_path):
    lm, _ = tiny
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps([{"image": "a.jpg", "caption": ["x y"]}, {"image": "b.jpg", "captions": ["z"]}]))
    out = tmp_path / "danger.json"
    with pytest.raises(SuiteFormatError, match=r"bad.json: item 1 lacks key\(s\) \['caption'\]"):
        write_variant_file(bad, out, "danger", lm.model, lm.tokenizer, 1)
    with pytest.raises(ValueError, match="unknown perturbation kind 'weapons'"):
        write_variant_file(bad, out, "weapons", lm.model, lm.tokenizer, 1)
    with pytest.raises(ValueError, match="is the input file"):
        write_variant_file(bad, bad, "danger", lm.model, lm.tokenizer, 1)
    assert not out.exists()


def test_bundled_vocab_and_vocab_errors(tmp_path):
    v = load_vocab()
    assert DEFAULT_VOCAB.stat().st_size < 100_000
    assert len(v.classes) >= 10 and sum(map(len, v.classes.values())) >= 300
    assert {"weapon", "criminal", "minefield", "gun", "bomb", "knife"} <= {e[0] for e in v.danger}
    assert v.nouns["people"] == ("person", v.nouns["person"][1], True) and v.nouns["sheep"][2] is False
    doc = json.loads(DEFAULT_VOCAB.read_text())
    doc["classes"]["vehicle"].append(["dog", "dogs"])
    (tmp_path / "v.json").write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="'dog' is in class 'animal' and in 'vehicle'"):
        load_vocab(tmp_path / "v.json")
    (tmp_path / "w.json").write_text(json.dumps({"classes": {}}))
    with pytest.raises(ValueError, match="expected an object with keys"):
        load_vocab(tmp_path / "w.json")


def _parse(argv):
    ap = argparse.ArgumentParser(prog="hardrank")
    add_perturb_parser(ap.add_subparsers(dest="command", required=True))
    return ap.parse_args(argv)


def test_cli_texts_and_images(tiny, tmp_path, capsys):
    _, cfg = tiny
    ann = _karpathy(tmp_path / "coco_karpathy_test.json", [("a.jpg", CAPTIONS[:5]), ("b.jpg", CAPTIONS[2:4])])
    out = tmp_path / "variants"
    argv = ["perturb", "texts", "--model", str(cfg), "--random-init", "--device", "cpu", "--annotations", str(ann),
            "--kinds", "danger", "rand_voca", "--seed", "1", "--out", str(out)]
    assert run_perturb(_parse(argv)) == 0
    reports = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["kind"] for r in reports] == ["danger", "rand_voca"] and reports[0]["perturbed"] == 7
    clean = read_karpathy(out / "coco_karpathy_test.json")
    assert [len(p) for p in read_rococo_variant(out / "danger.json", clean)] == [5, 2]
    assert run_perturb(_parse(argv)) == 0  # existing files are skipped
    assert capsys.readouterr().out == ""

    # perturb images: the real alteration, written where `eval --image-variants mix_0.9` looks
    from PIL import Image

    for name, colour in (("a.jpg", (255, 0, 0)), ("b.jpg", (0, 0, 255))):
        Image.new("RGB", (40, 30), colour).save(tmp_path / name)
    assert run_perturb(_parse(["perturb", "images", "--method", "mix", "--images", str(tmp_path),
                               "--annotations", str(ann), "--out", str(tmp_path)])) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["images"] == 2 and rep["written"] == 2 and 0 <= rep["self_pairs"] <= 2
    for name in ("a.jpg", "b.jpg"):
        with Image.open(tmp_path / "mix_0.9_s1" / name) as im:
            assert im.size == (384, 384)


def test_python_entry_point_writes_what_the_cli_writes(tiny, tmp_path, capsys):
    """`hardrank perturb texts` is hardrank.perturb_texts behind its flags: same files, same reports."""
    import hardrank

    _, cfg = tiny
    ann = _karpathy(tmp_path / "coco_karpathy_test.json", [("a.jpg", CAPTIONS[:5]), ("b.jpg", CAPTIONS[2:4])])
    torch.manual_seed(1)  # the random text encoder's weights
    reports = hardrank.perturb_texts(model=str(cfg), random_init=True, device="cpu", annotations=str(ann),
                                     kinds=["same_concept", "danger"], out=str(tmp_path / "api"))
    assert [r["kind"] for r in reports] == ["same_concept", "danger"]
    torch.manual_seed(1)
    assert run_perturb(_parse(["perturb", "texts", "--model", str(cfg), "--random-init", "--device", "cpu",
                               "--annotations", str(ann), "--kinds", "same_concept", "danger",
                               "--out", str(tmp_path / "cli")])) == 0
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [{k: v for k, v in r.items() if k != "path"} for r in printed] == \
        [{k: v for k, v in r.items() if k != "path"} for r in reports]
    for kind in ("same_concept", "danger"):
        assert (tmp_path / "api" / f"{kind}.json").read_bytes() == (tmp_path / "cli" / f"{kind}.json").read_bytes()
