"""`hardrank attack`: toy-world adversarial variants beat random ones, match a brute-force twin, load as rococo."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from hardrank.config import EmbedOptions, SuiteOptions
from hardrank.embed import EmbedPipeline
from hardrank.formats.karpathy import read_karpathy
from hardrank.items import ImageRef, Tables
from hardrank.jobs.cli import main
from hardrank.models import ModelSpec, load_model
from hardrank.perturb.attack import (
    Concepts,
    Vocabulary,
    concepts_from_rococo,
    make_candidates,
    nearest_images,
    own_scores,
    pick_partners,
    segment_winners,
    tag_captions,
    vocab_from_file,
    word_class,
    write_image_candidates,
)
from hardrank.perturb.images import _alter_batch, _load, _rand_box, _save_jpeg, _to_uint8
from hardrank.suites import load_suites
from hardrank.text import pre_caption
from hardrank.toyworld import TOY_CHECKPOINTS, TOY_MODEL, WorldConfig, build_world
from hardrank.word_tags import _tag

CKPT = TOY_CHECKPOINTS / "toy-clip_step0700.safetensors"
SMALL = WorldConfig(n_train=0, n_test=40, n_inpaint=0, alter_methods=("mix",))


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> Path:
    return build_world(tmp_path_factory.mktemp("w") / "world", SMALL)


def _args(world: Path, out: Path, store: Path, *extra) -> list[str]:
    return ["--model", str(TOY_MODEL), "--checkpoint", str(CKPT), "--annotations", str(world / "karpathy_test.json"),
            "--images", str(world / "images"), "--store", str(store), "--out", str(out), "--device", "cpu",
            "--quiet", *extra]


# -- small pieces against simple references -------------------------------------------------------

def _winners_ref(values, ptr):
    best, top = [], []
    for i in range(len(ptr) - 1):
        seg = list(values[ptr[i]:ptr[i + 1]])
        if not seg:
            best.append(-1)
            top.append(-np.inf)
            continue
        m = max(seg)
        best.append(ptr[i] + seg.index(m))
        top.append(m)
    return best, top


@pytest.mark.parametrize("ptr,values", [
    ([0, 0], []), ([0, 1], [0.5]), ([0, 3, 3, 5], [1.0, 2.0, 2.0, -1.0, -1.0]),
    ([0, 0, 4, 4], [0.0, 0.0, 0.0, 0.0]), ([0, 2, 4, 7], [3.0, -2.0, -5.0, -5.0, 1.0, 1.0, 0.5])])
def test_segment_winners_awkward(ptr, values):
    best, top = segment_winners(np.array(values, dtype=np.float32), np.array(ptr))
    rb, rt = _winners_ref(values, ptr)
    assert best.tolist() == rb and top.tolist() == rt


def test_segment_winners_random_against_reference():
    rng = np.random.default_rng(0)
    sizes = rng.integers(0, 5, 300)
    ptr = np.concatenate([[0], np.cumsum(sizes)])
    vals = rng.integers(-3, 3, ptr[-1]).astype(np.float32)  # many ties
    best, top = segment_winners(vals, ptr)
    rb, rt = _winners_ref(vals.tolist(), ptr.tolist())
    assert best.tolist() == rb and top.tolist() == rt


def test_own_scores_is_each_item_against_its_query():
    rng = np.random.default_rng(1)
    q, x = rng.normal(size=(5, 8)).astype(np.float32), rng.normal(size=(23, 8)).astype(np.float32)
    owner = rng.integers(0, 5, 23)
    got = own_scores(q, x, owner, chunk=4)
    assert np.allclose(got, [x[n] @ q[owner[n]] for n in range(23)], atol=1e-5)
    assert own_scores(q, x[:0], owner[:0]).shape == (0,)


def test_nearest_images_excludes_self_and_breaks_ties_by_index():
    e = np.array([[1, 0], [1, 0], [0, 1], [1, 0], [0.6, 0.8]], dtype=np.float32)
    nb = nearest_images(e, 3, chunk=2)
    assert nb[0].tolist() == [1, 3, 4] and nb[1].tolist() == [0, 3, 4] and nb[2].tolist() == [4, 0, 1]
    assert nearest_images(e[:2], 5).tolist() == [[1], [0]]
    with pytest.raises(ValueError, match="at least 2 images"):
        nearest_images(e[:1], 3)


def test_pick_partners_most_wins_then_margin_then_nearer():
    nan = np.nan
    m = np.array([[[0.1, -0.2, nan], [0.05, 0.01, nan], [0.05, 0.01, nan]],   # 2 wins beats 1 win
                  [[-0.1, -0.1, -0.1], [-0.01, -0.3, -0.2], [-0.05, -0.05, -0.05]],  # no wins: mean
                  [[0.2, 0.2, 0.2], [0.2, 0.2, 0.2], [0.1, 0.1, 0.1]]], dtype=np.float32)  # tie: nearer
    choice, wins, mean = pick_partners(m, 3)
    assert choice.tolist() == [1, 2, 0] and wins.tolist() == [2, 0, 3]
    assert np.allclose(mean, [0.03, -0.05, 0.2])


def test_word_classes_and_candidates():
    caps = ["a red ice-cream on two large tables", "the the"]
    cls = tag_captions(caps)
    assert cls[0] == [None, "colour", None, "spatial", "number", "adjective", "noun"] and cls[1] == [None, None]
    vocab = Vocabulary({"colour": ["blue", "red", "green"], "number": ["three"], "noun": ["chairs", "dogs"],
                        "spatial": ["under"], "adjective": ["small"]}, "test")
    concepts = Concepts("test", {"red": frozenset({"green"})})
    c = make_candidates(caps, cls, vocab, concepts)
    assert c.ptr.tolist() == [0, 6, 6]
    assert c.texts[0] == "a blue ice-cream on two large tables"  # round robin: each position's first word first
    assert "a green ice-cream on two large tables" not in c.texts  # same concept
    assert "a red ice-cream on two large tables" not in c.texts
    assert set(c.wclass) == {"colour", "spatial", "number", "adjective", "noun"}
    b = make_candidates(caps, cls, vocab, concepts, budget=3, positions=("noun", "colour"),
                        forbidden=[{"a red ice-cream on two large chairs"}, set()])
    assert b.texts == ["a blue ice-cream on two large tables", "a red ice-cream on two large dogs"]
    with pytest.raises(ValueError, match="budget"):
        make_candidates(caps, cls, vocab, concepts, budget=0)


def test_vocab_file_and_concepts(world, tmp_path):
    f = tmp_path / "words.txt"
    f.write_text("Red\nleft\n3\ncircle\n")
    v = vocab_from_file(f)
    assert v.words == {"noun": ["circle"], "colour": ["red"], "number": ["3"], "spatial": ["left"]}
    f.write_text('["running fast"]')
    with pytest.raises(ValueError, match="not one content word"):
        vocab_from_file(f)
    c = concepts_from_rococo(world / "karpathy_test.json", world / "rococo" / "same_concept.json")
    assert "blue" in c.groups["red"] and c.same("red", "blue") and not c.same("red", "circle")
    assert not c.same("left", "right")


# -- end to end on the toy world ------------------------------------------------------------------

@pytest.fixture(scope="module")
def text_attack(world, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("att")
    out, store = tmp / "out", tmp / "store"
    assert main(["attack", "texts", *_args(world, out, store), "--suite", "rococo", "--data", str(world / "rococo"),
                 "--budget", "24"]) == 0
    return out, store


def test_attack_lowers_r1_more_than_random_variants(text_attack):
    out, _ = text_attack
    s = json.loads((out / "summary_texts.json").read_text())
    (p,) = s["checkpoints"]
    assert p["checkpoint"] == "toy-clip_step0700" and p["captions"] == 200
    assert set(p["published"]) == {"same_concept", "diff_concept", "rand_voca", "danger"}
    adv = p["adversarial"]["R@1"]
    for name, rnd in p["published"].items():  # same size: one perturbed caption per original
        assert adv < rnd["R@1"], (name, adv, rnd)
        assert p["adversarial"]["false_rate"] > rnd["false_rate"]
    assert 0 < p["success_rate"] <= 100 and p["successes"] == round(p["success_rate"] * 2)
    assert sum(c["successes"] for c in p["by_class"].values()) == p["successes"]
    t = json.loads((out / "transfer_texts.json").read_text())
    assert t["attackers"] == ["toy-clip_step0700"] and t["R@1"] == [[adv]]
    assert json.loads((out / "concepts.json").read_text())["groups"]["red"]


def test_adversarial_files_load_and_evaluate_as_rococo(text_attack, world):
    out, store = text_attack
    clean = read_karpathy(world / "karpathy_test.json")
    adv = json.loads((out / "adv_toy-clip_step0700.json").read_text())
    for (im, caps), item in zip(clean, adv):  # originals first, then one single-word substitution per original
        assert item["image"] == im and item["caption"][:len(caps)] == caps
        for orig, new in zip(caps[:5], item["caption"][len(caps):]):
            a, b = pre_caption(orig).split(), new.split()
            assert len(a) == len(b) and sum(x != y for x, y in zip(a, b)) == 1
    tables = Tables.empty()
    (suite,) = load_suites(["rococo"], tables, SuiteOptions(annotations=str(out / "karpathy_test.json"),
                           images=str(world / "images"), text_variants=("adv_toy-clip_step0700",)))
    assert suite.meta["text_variants"] == ["adv_toy-clip_step0700"]
    assert main(["eval", "--model", str(TOY_MODEL), "--checkpoint", str(CKPT), "--suite", "rococo",
                 "--annotations", str(out / "karpathy_test.json"), "--images", str(world / "images"),
                 "--text-variants", "adv_toy-clip_step0700", "--store", str(store), "--device", "cpu",
                 "--out", str(out / "again"), "--quiet"]) == 0
    again = json.loads((out / "again" / "toy-clip_step0700" / "rococo.json").read_text())
    s = json.loads((out / "summary_texts.json").read_text())["checkpoints"][0]
    assert again["metrics"]["adv_toy-clip_step0700"]["i2t"]["R@1"] == s["adversarial"]["R@1"]


def test_brute_force_twin_finds_the_same_winners(world, tmp_path):
    words = ["red", "blue", "green", "white", "left", "right", "on", "small", "large", "circle", "square", "picture"]
    (tmp_path / "v.txt").write_text("\n".join(words))
    out, store = tmp_path / "out", tmp_path / "store"
    assert main(["attack", "texts", *_args(world, out, store), "--suite", "karpathy", "--concepts",
                 str(world / "rococo" / "same_concept.json"), "--vocab", str(tmp_path / "v.txt"),
                 "--budget", "1000", "--precision", "fp32"]) == 0
    adv = json.loads((out / "adv_toy-clip_step0700.json").read_text())
    # the twin: its own concept pairs, per-word tags, every (position, word) in loops, texts encoded one by one
    clean = read_karpathy(world / "karpathy_test.json")
    same = set()
    sc = json.loads((world / "rococo" / "same_concept.json").read_text())
    for (_, caps), item in zip(clean, sc):
        for a, b in zip(caps[:5], item["caption"][len(caps):]):
            d = [(x, y) for x, y in zip(pre_caption(a).split(), pre_caption(b).split()) if x != y]
            if len(d) == 1:
                same |= {d[0], d[0][::-1]}
    cls_of = {w: word_class(w, _tag(w)) for w in words}
    lm = load_model(ModelSpec(str(TOY_MODEL), str(CKPT), "fp32", "cpu"))
    pipe = EmbedPipeline.from_checkpoints(str(TOY_MODEL), [str(CKPT)], EmbedOptions(store=str(store), device="cpu",
                                                                                    precision="fp32"))
    tables = Tables.empty()
    rows = tables.images.add_many(ImageRef(str(world / "images" / im)) for im, _ in clean)
    pipe.run(tables)
    img = pipe.embeddings(0, tables)["image"][rows]

    def enc(texts):
        with torch.inference_mode():
            e = lm.model.encode_text(lm.tokenizer(texts)).float()
        return torch.nn.functional.normalize(e, dim=-1).numpy()

    decisive = agree = 0
    for i, ((_, caps), item) in enumerate(zip(clean, adv)):
        own = {pre_caption(c) for c in caps}
        for k, cap in enumerate(caps[:5]):
            ws = pre_caption(cap).split()
            cands = []
            for j, w in enumerate(ws):
                c = word_class(w, _tag(w))
                for v in words:
                    t = " ".join(ws[:j] + [v] + ws[j + 1:])
                    if c is not None and cls_of[v] == c and v != w and (w, v) not in same and t not in own \
                            and t not in cands:
                        cands.append(t)
            if not cands:
                assert item["caption"][len(caps) + k] == pre_caption(cap)
                continue
            e = enc([pre_caption(cap)] + cands) @ img[i]
            margin = e[1:] - e[0]
            order = np.argsort(-margin, kind="stable")
            if len(order) > 1 and margin[order[0]] - margin[order[1]] < 1e-4:
                continue  # a near tie: float rounding may pick either
            decisive += 1
            agree += cands[order[0]] == item["caption"][len(caps) + k]
    assert decisive >= 150 and agree == decisive


def test_image_attack_outranks_random_partners(world, tmp_path):
    out, store = tmp_path / "out", tmp_path / "store"
    assert main(["attack", "images", *_args(world, out, store), "--method", "mix", "-k", "4", "--size", "64"]) == 0
    s = json.loads((out / "summary_images.json").read_text())
    (p,) = s["checkpoints"]
    folder = world / "images" / "adv_toy-clip_step0700_mix_0.9_s1"
    assert Path(p["folder"]) == folder and len(list(folder.rglob("*.jpg"))) == 40
    assert p["adversarial"]["R@1"] <= p["published"]["mix_0.9_s1"]["R@1"]
    assert p["adversarial"]["false_rate"] >= p["published"]["mix_0.9_s1"]["false_rate"]
    assert sum(p["partner_rank"].values()) == 40
    # every written image is one candidate, byte for byte, and loads as an image variant
    cand_dir, = (out / "candidates").glob("mix_0.9_s1_64px_q*")  # keyed by size, quality, the image list
    cands = {f.read_bytes() for f in cand_dir.rglob("*.jpg")}
    assert all(f.read_bytes() in cands for f in folder.rglob("*.jpg"))
    tables = Tables.empty()
    (suite,) = load_suites(["rococo"], tables, SuiteOptions(annotations=str(world / "karpathy_test.json"),
                           images=str(world / "images"), text_variants=(),
                           image_variants=("adv_toy-clip_step0700_mix_0.9",), seeds=(1,)))
    assert suite.meta["image_variants"] == ["adv_toy-clip_step0700_mix_0.9_s1"]


def test_image_attack_reports_progress_on_every_long_stage(world, tmp_path, capsys):
    """`attack images` was silent between its embedding bars for minutes (writing k candidates an image,
    scoring them, copying the winners): each stage now says what it does, and the writing stages advance
    a progress bar of the project's kind (a log line without a terminal)."""
    args = ["attack", "images", *_args(world, tmp_path / "out", tmp_path / "store"), "--method", "mix", "-k", "4",
            "--size", "64"]
    args.remove("--quiet")
    assert main(args) == 0
    err = capsys.readouterr().err
    stages = ["embedding 40 images and", "each image's 4 nearest images", "160 candidate images (mix, an image with "
              "each of its partners) into", "write candidate images: 160/160 (100%)", "160 candidate images (160 "
              "written, 0 kept)", "toy-clip_step0700: scoring 40 x 4 candidates", "write adv_toy-clip_step0700_mix_0"
              ".9_s1: 40/40 (100%)", "evaluating 1 checkpoint(s) on"]
    at = [err.find(s) for s in stages]
    assert all(a >= 0 for a in at) and at == sorted(at), list(zip(stages, at))


@pytest.mark.parametrize("method", ["mix", "patch"])
def test_image_candidates_use_the_perturb_alteration(world, tmp_path, method):
    paths = [im for im, _ in read_karpathy(world / "karpathy_test.json")][:3]
    files, n = write_image_candidates(world / "images", paths, [(0, 2), (1, 0)], tmp_path, method=method, lam=0.7,
                                      seed=3, size=48, quality=95)
    assert n == 2 and write_image_candidates(world / "images", paths, [(0, 2)], tmp_path, method=method, lam=0.7,
                                             seed=3, size=48, quality=95)[1] == 0
    rs = np.random.RandomState(3)
    boxes = [_rand_box(rs, 48, 48, 0.7) for _ in paths]
    x = torch.from_numpy(np.stack([_load(world / "images" / p, 48) for p in paths])).permute(0, 3, 1, 2).float() / 255
    for f, (i, j) in zip(files, [(0, 2), (1, 0)]):  # each pair with its own image's box
        perm = torch.arange(3)
        perm[i] = j
        y = _to_uint8(_alter_batch(x, perm, method=method, lam=0.7,
                                   box=boxes[i] if method == "patch" else None)).numpy()
        _save_jpeg(y[i], tmp_path / "ref.jpg", 95)
        assert f.read_bytes() == (tmp_path / "ref.jpg").read_bytes(), (i, j)  # byte for byte: the same code path


def test_report_shows_the_transfer_heat_map(text_attack, tmp_path):
    pytest.importorskip("matplotlib")
    out, _ = text_attack
    assert main(["report", str(out), "--out", str(tmp_path / "rep")]) == 0
    assert (tmp_path / "rep" / "plots" / "transfer_texts.png").stat().st_size > 1000
    assert "Attack transfer (texts)" in (tmp_path / "rep" / "report.md").read_text()


def test_attack_bad_inputs_exit_3_naming_the_file(world, tmp_path, capsys):
    items = json.loads((world / "karpathy_test.json").read_text())
    one, gone = tmp_path / "one.json", tmp_path / "gone.json"
    one.write_text(json.dumps(items[:1]))
    gone.write_text(json.dumps(items[:2] + [{**items[2], "image": "no_such_image.jpg"}]))
    args = _args(world, tmp_path / "out", tmp_path / "store")
    at = args.index("--annotations") + 1
    # one image: no partner to mix with; refused before a model is loaded (it was a kernel error, exit 3 by accident)
    args[at] = str(one)
    assert main(["attack", "images", *args]) == 3
    assert f"{one}: 1 image(s); the image attack needs at least 2" in capsys.readouterr().err
    # an image that cannot be read is bad data (it was a usage error, exit 2)
    args[at] = str(gone)
    assert main(["attack", "images", *args]) == 3
    err = capsys.readouterr().err
    assert "no_such_image.jpg could not be read" in err and f"fix or remove it from {gone}" in err
    # an annotation path leaving the images folder: refused before anything is written (the adversarial
    # copies go to <images>/adv_*/<path>, which would be outside it)
    escape = tmp_path / "escape.json"
    escape.write_text(json.dumps(items[:2] + [{**items[2], "image": "../../outside.jpg"}]))
    args[at] = str(escape)
    assert main(["attack", "images", *args]) == 3
    assert "'../../outside.jpg' must be relative to images_root, without '..'" in capsys.readouterr().err
    assert not (tmp_path / "outside.jpg").exists() and not list(tmp_path.parent.glob("outside*"))
