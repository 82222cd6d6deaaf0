"""AmodalReasonSeg: mask IoU kernel vs reference, LISA gIoU/cIoU by hand, COCO codecs, loader, toy world, baseline."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch

from hardrank.formats.amodal import clip_regions_items, load_amodal
from hardrank.formats.annotations import SuiteFormatError
from hardrank.formats.masks import _counts_to_string, _string_to_counts, polygons_to_mask, rle_decode, rle_encode
from hardrank.items import Tables
from hardrank.kernels.masks import giou_ciou, mask_iou_stats
from hardrank.kernels.masks_reference import giou_ciou_ref, mask_iou_stats_ref
from hardrank.scoring.mask_score import clip_regions, score_predictions
from hardrank.toyworld.amodal import build_amodal_world


def _t(*arrays):
    return [torch.as_tensor(np.asarray(a)) for a in arrays]


def _stats(pred, gt, **kw):
    return [t.numpy() for t in mask_iou_stats(_t(*pred), _t(*gt), **kw)]


# ----------------------------------------------------------------------------- gIoU / cIoU by hand

def test_empty_gt_rules():
    z = np.zeros((3, 4), np.uint8)
    one = z.copy()
    one[1, 2] = 1
    s = _stats([z, one], [z, z])
    assert s[0].tolist() == [0, 0] and s[1].tolist() == [0, 1]
    assert s[2].tolist() == [True, True] and s[3].tolist() == [True, False]
    g, c = giou_ciou(*s)
    assert g == pytest.approx(0.5)       # (1 + 0) / 2: empty+empty scores 1, empty GT + a pixel scores 0
    assert c == 0.0                      # 0 / (1 + 1e-10)
    assert giou_ciou(*_stats([z], [z])) == (1.0, 0.0)


def test_hand_worked_giou_ciou_and_lisa_epsilons():
    gt = np.array([[1, 1, 0, 0], [1, 1, 0, 0]], np.uint8)
    pred = np.array([[1, 0, 0, 0], [1, 0, 1, 1]], np.uint8)    # I = 2, U = 6
    gt2 = np.array([[0, 1], [1, 1]], np.uint8)
    pred2 = np.array([[0, 1], [1, 1]], np.uint8)               # I = U = 3
    s = _stats([pred, pred2], [gt, gt2])
    assert s[0].tolist() == [2, 3] and s[1].tolist() == [6, 3]
    g, c = giou_ciou(*s)
    assert g == pytest.approx((2 / (6 + 1e-5) + 3 / (3 + 1e-5)) / 2, abs=0, rel=1e-12)
    assert c == pytest.approx(5 / (9 + 1e-10), abs=0, rel=1e-12)
    assert (g, c) == pytest.approx(giou_ciou_ref(*s), rel=1e-12)


def test_ignore_label_removed_from_both_and_gt_values_above_one_binarised():
    gt = np.array([[2, 255, 0], [1, 255, 0]], np.uint8)        # 2 is foreground, 255 ignored
    pred = np.array([[1, 1, 1], [0, 1, 0]], np.uint8)          # the two ignored pixels do not count
    i, u, ge, pe = _stats([pred], [gt])
    assert (i[0], u[0], ge[0], pe[0]) == (1, 3, False, False)
    allign = np.full((2, 3), 255, np.uint8)                    # all ignored: both empty -> scores 1
    s = _stats([np.ones((2, 3), np.uint8)], [allign])
    assert [x[0] for x in s] == [0, 0, True, True]
    assert giou_ciou(*s)[0] == 1.0
    s = _stats([pred], [gt], ignore_index=None)                # without ignore, 255 is foreground
    assert (s[0][0], s[1][0]) == (3, 5)


def test_resolution_mismatch_nearest_for_binary_bilinear_then_threshold_for_logits():
    gt = np.ones((1, 4), np.uint8)
    # bilinear (align_corners=False) of [-1, 1] to width 4: [-1, -0.5, 0.5, 1] -> [0, 0, 1, 1]
    i, u, _, _ = _stats([np.array([[-1.0, 1.0]], np.float32)], [gt], pred_kind="logit")
    assert (i[0], u[0]) == (2, 4)
    i, _, _, _ = _stats([np.array([[0.2, 0.9]], np.float32)], [gt], pred_kind="prob")  # [.2 .375 .725 .9]
    assert i[0] == 2
    # nearest-exact 2x2 -> 4x4: the top-left pixel becomes the top-left 2x2 block
    gt44 = np.zeros((4, 4), np.uint8)
    gt44[:2, :2] = 1
    s = _stats([np.array([[255, 0], [0, 0]], np.uint8)], [gt44])
    assert (s[0][0], s[1][0]) == (4, 4)


def test_kernel_input_errors_say_what_to_do():
    g = torch.zeros(2, 3, dtype=torch.uint8)
    with pytest.raises(ValueError, match="pred_kind must be one of"):
        mask_iou_stats([g], [g], pred_kind="sigmoid")
    with pytest.raises(TypeError, match=r"gt\[0\] has dtype torch.float32.*cast"):
        mask_iou_stats([g], [g.float()])
    with pytest.raises(TypeError, match="needs floats; use pred_kind='binary'"):
        mask_iou_stats([g], [g], pred_kind="logit")
    with pytest.raises(ValueError, match="pred has 2 masks but gt has 1"):
        mask_iou_stats([g, g], [g])
    with pytest.raises(ValueError, match=r"\(n, H, W\) tensor"):
        mask_iou_stats(g, g)
    with pytest.raises(ValueError, match="at least one mask"):
        giou_ciou([], [], [], [])


# ----------------------------------------------------------------------------- kernel vs reference

@pytest.mark.parametrize("kind", ["binary", "logit", "prob"])
def test_kernel_matches_reference_on_awkward_sizes(kind):
    rng = np.random.default_rng({"binary": 1, "logit": 2, "prob": 3}[kind])
    sizes = [(1, 1), (2, 3), (7, 13), (13, 7), (17, 1), (31, 29), (0, 5)]
    preds, gts = [], []
    for k in range(23):                                        # block=4: 23 pairs = 5 full blocks + 3
        H, W = sizes[k % len(sizes)]
        h, w = (H, W) if k % 3 == 0 or H == 0 else tuple(int(v) for v in rng.integers(1, 19, 2))
        g = rng.choice(np.array([0, 1, 2, 255], np.uint8), size=(H, W), p=[0.45, 0.35, 0.1, 0.1])
        if k == 5:
            g[:] = 255                                         # all ignored
        if kind == "binary":
            p = rng.integers(0, 2, (h, w)).astype(np.uint8) * rng.choice(np.array([1, 255], np.uint8))
        elif kind == "logit":
            p = rng.normal(size=(h, w)).astype(np.float32)
        else:
            p = rng.random((h, w)).astype(np.float32)
        preds.append(p)
        gts.append(g)
    got = mask_iou_stats(_t(*preds), _t(*gts), pred_kind=kind, block=4)
    ref = mask_iou_stats_ref(preds, gts, pred_kind=kind)
    for a, b in zip(got, ref):
        np.testing.assert_array_equal(a.numpy(), b)
    assert giou_ciou(*got) == pytest.approx(giou_ciou_ref(*ref), rel=1e-12)
    # a stacked (n, H, W) batch gives the same as the list
    same = [k for k in range(len(gts)) if gts[k].shape == (7, 13) and preds[k].shape == (7, 13)]
    if same:
        st = mask_iou_stats(torch.from_numpy(np.stack([preds[k] for k in same])),
                            torch.from_numpy(np.stack([gts[k] for k in same])), pred_kind=kind)
        np.testing.assert_array_equal(st[0].numpy(), ref[0][same])


def test_kernel_gpu_matches_cpu():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA")
    rng = np.random.default_rng(5)
    preds = [torch.from_numpy(rng.normal(size=(33, 47)).astype(np.float32)) for _ in range(9)]
    gts = [torch.from_numpy(rng.choice(np.array([0, 1, 255], np.uint8), size=(65, 95))) for _ in range(9)]
    cpu = mask_iou_stats(preds, gts, pred_kind="logit")
    gpu = mask_iou_stats([p.cuda() for p in preds], [g.cuda() for g in gts], pred_kind="logit")
    assert gpu[0].device.type == "cuda"
    for a, b in zip(cpu, gpu):  # bilinear rounding may flip a pixel sitting on the threshold
        assert (a.long() - b.cpu().long()).abs().max() <= 2


# ----------------------------------------------------------------------------- COCO RLE and polygons

def test_compressed_rle_decoded_by_hand():
    # "1232" -> counts [1, 2, 3, 2 + 2]: the 4th count is stored as a delta from the 2nd
    assert _string_to_counts("1232") == [1, 2, 3, 4]
    # column-major on 2x5: 0 | 1 1 | 0 0 0 | 1 1 1 1 -> columns [0,1], [1,0], [0,0], [1,1], [1,1]
    np.testing.assert_array_equal(rle_decode({"size": [2, 5], "counts": "1232"}),
                                  [[0, 1, 0, 1, 1], [1, 0, 0, 1, 1]])
    assert _string_to_counts("T3") == [100]         # 100 = 4 + 3*32: 'T' = 48 + (4 | 0x20), then '3'
    assert _counts_to_string([5, 10, 2, 7]) == "5:2M"  # 7 - 10 = -3 -> 29 (sign bit 0x10 set) -> 'M'
    assert _string_to_counts("5:2M") == [5, 10, 2, 7]
    assert rle_encode(np.array([[0, 1, 0, 1, 1], [1, 0, 0, 1, 1]])) == {"size": [2, 5], "counts": "1232"}
    assert rle_encode(np.ones((2, 2)), compress=False)["counts"] == [0, 4]


def test_rle_round_trip_and_errors():
    rng = np.random.default_rng(0)
    for k in range(60):
        h, w = (int(v) for v in rng.integers(0, 40, 2))
        m = (rng.random((h, w)) < rng.random()).astype(np.uint8)
        if k % 10 == 0:
            m[:] = k % 20 == 0                         # all ones / all zeros
        for compress in (True, False):
            np.testing.assert_array_equal(rle_decode(rle_encode(m, compress)), m)
    big = np.zeros((300, 400), np.uint8)
    big[10:290, 7:390] = 1                             # long runs: multi-char counts
    np.testing.assert_array_equal(rle_decode(rle_encode(big)), big)
    with pytest.raises(ValueError, match="sum to 9 but size 2x5 has 10"):
        rle_decode({"size": [2, 5], "counts": [4, 5]})
    with pytest.raises(ValueError, match="ends inside a count"):
        rle_decode({"size": [2, 5], "counts": "T"})


def test_polygon_rasterisation_like_pycocotools():
    sq = polygons_to_mask([[0, 0, 4, 0, 4, 4, 0, 4]], 6, 7)       # COCO: pixels 0..3, not PIL's 0..4
    want = np.zeros((6, 7), np.uint8)
    want[0:4, 0:4] = 1
    np.testing.assert_array_equal(sq, want)
    # the same square listed clockwise or counter-clockwise, and a fractional box: pixel (x, y) is in
    # when x0 <= x < x1 and y0 <= y < y1
    np.testing.assert_array_equal(polygons_to_mask([[0, 4, 4, 4, 4, 0, 0, 0]], 6, 7), want)
    frac = polygons_to_mask([[0.5, 0.5, 3.5, 0.5, 3.5, 2.5, 0.5, 2.5]], 5, 5)
    want = np.zeros((5, 5), np.uint8)
    want[1:3, 1:4] = 1
    np.testing.assert_array_equal(frac, want)
    # partly outside the image: clipped; two polygons: united
    out = polygons_to_mask([[-2, -2, 3, -2, 3, 3, -2, 3], [4, 4, 6, 4, 6, 6, 4, 6]], 5, 5)
    want = np.zeros((5, 5), np.uint8)
    want[0:3, 0:3] = 1
    want[4, 4] = 1
    np.testing.assert_array_equal(out, want)
    assert polygons_to_mask([], 3, 3).sum() == 0


def test_polygon_agrees_with_pixel_centre_test_away_from_the_boundary():
    # pycocotools' rasteriser works on a 5x grid and is off by up to ~0.5 px along edges; away from
    # the boundary it must agree with an exact even-odd test of the pixel centres (x, y)
    rng = np.random.default_rng(3)
    ang = np.sort(rng.uniform(0, 2 * np.pi, 9))
    r = rng.uniform(12, 20, 9)
    v = np.stack([25 + r * np.cos(ang), 22 + r * np.sin(ang)], 1)          # (9, 2) convex-ish polygon
    m = polygons_to_mask([v.ravel().tolist()], 45, 50)
    yy, xx = np.mgrid[0:45, 0:50]
    p = np.stack([xx.ravel(), yy.ravel()], 1).astype(float)                # (P, 2) pixel centres
    a, b = v, np.roll(v, -1, 0)                                            # (E, 2) edges a -> b
    crosses = ((a[:, 1] > p[:, None, 1]) != (b[:, 1] > p[:, None, 1])) & (
        p[:, None, 0] < a[:, 0] + (p[:, None, 1] - a[:, 1]) * (b[:, 0] - a[:, 0]) / (b[:, 1] - a[:, 1]))
    inside = (crosses.sum(1) % 2 == 1).reshape(45, 50)
    ab = b - a
    t = np.clip(((p[:, None] - a) * ab).sum(2) / (ab * ab).sum(1), 0, 1)  # (P, E)
    dist = np.linalg.norm(a + t[..., None] * ab - p[:, None], axis=2).min(1).reshape(45, 50)
    assert dist[m.astype(bool) != inside].max() < 1.0
    assert abs(int(m.sum()) - int(inside.sum())) < 0.05 * inside.sum()


# ----------------------------------------------------------------------------- loader

def _doc(tmp_path, **edit):
    doc = {"images": [{"id": 1, "file_name": "a.jpg", "height": 4, "width": 5}],
           "questions": [{"id": "q1", "image_id": 1, "question": "what?",
                          "targets": [{"visible": [[0, 0, 2, 0, 2, 2, 0, 2]],
                                       "amodal": {"size": [4, 5], "counts": [0, 4, 16]}}]}],
           "instances": [{"id": 9, "image_id": 1, "visible": [], "amodal": [[0, 0, 3, 0, 3, 3, 0, 3]]}]}
    for k, v in edit.items():
        v(doc) if callable(v) else doc.__setitem__(k, v)
    p = tmp_path / "annotations.json"
    p.write_text(json.dumps(doc))
    return p


def test_loader_reads_forms_and_unions_targets(tmp_path):
    from PIL import Image

    Image.fromarray(np.array([[0, 1, 1, 0, 0]] * 2 + [[255] * 5] * 2, np.uint8)).save(tmp_path / "m.png")
    _doc(tmp_path, extra=lambda d: d["questions"][0]["targets"].extend(
        [{"visible": "m.png", "amodal": "m.png"}, {"instance_id": 9}]))
    data = load_amodal(tmp_path)                                    # a folder means folder/annotations.json
    q = data.questions[0]
    assert len(q.targets) == 3 and data.images[1]["path"].endswith("a.jpg")
    vis, amo = data.gt_masks(q)
    np.testing.assert_array_equal(vis, [[1, 1, 1, 0, 0], [1, 1, 1, 0, 0], [255] * 5, [255] * 5])
    assert amo[:, 0].tolist() == [1, 1, 1, 1]       # RLE column 0 is foreground: it wins over the PNG's 255
    assert amo[2, 4] == 255 and amo[0, 2] == 1
    assert data.amodal_box(data.instances[1][0]) == (0.0, 0.0, 3.0, 3.0)  # from the mask when no bbox


@pytest.mark.parametrize("edit, message", [
    (dict(images=[{"id": 1, "file_name": "a.jpg"}]), r"images\[0\] needs 'id', 'file_name', 'height' and 'width'"),
    (dict(x=lambda d: d["questions"][0].pop("targets")), r"questions\[0\] needs .*'targets'"),
    (dict(x=lambda d: d["questions"][0].update(image_id=7)), r"question 'q1': image_id 7 is not in 'images'"),
    (dict(x=lambda d: d["questions"][0]["targets"][0]["amodal"].update(size=[5, 4])),
     r"question 'q1' target 0 amodal: RLE size \[5, 4\] does not match"),
    (dict(x=lambda d: d["questions"][0]["targets"][0].update(visible=[[0, 0, 1, 1]])),
     r"question 'q1' target 0 visible: polygon 0 has 4 coordinates"),
    (dict(x=lambda d: d["questions"][0]["targets"][0].update(visible="missing.png")),
     r"question 'q1' target 0 visible: mask PNG .*missing.png does not exist"),
    (dict(x=lambda d: d["questions"][0]["targets"][0].pop("amodal")), r"question 'q1' target 0: lacks the 'amodal'"),
    (dict(x=lambda d: d["questions"][0]["targets"].append({"instance_id": 3})),
     r"question 'q1' target 1: instance_id 3 is not in 'instances'"),
    (dict(x=lambda d: d["questions"].append(dict(d["questions"][0]))), r"question 'q1': duplicate question id"),
])
def test_loader_errors_name_file_and_question(tmp_path, edit, message):
    p = _doc(tmp_path, **edit)
    with pytest.raises(SuiteFormatError, match=message) as exc:
        load_amodal(p)
    assert str(p) in str(exc.value)


def test_gt_png_of_only_0_and_255_is_refused(tmp_path):
    from PIL import Image

    Image.fromarray(np.array([[0, 255, 255, 0, 0]] * 4, np.uint8)).save(tmp_path / "m.png")
    data = load_amodal(_doc(tmp_path, x=lambda d: d["questions"][0]["targets"][0].update(visible="m.png")))
    with pytest.raises(SuiteFormatError, match=r"question 'q1' target 0 visible: PNG .* holds only 0 and 255"):
        data.gt_masks(data.questions[0])


def test_prediction_folder_errors(tmp_path):
    p = _doc(tmp_path)
    pred = tmp_path / "pred"
    pred.mkdir()
    np.savez(pred / "other.npz", visible=np.zeros((4, 5)), amodal=np.zeros((4, 5)))
    with pytest.raises(SuiteFormatError, match="no prediction matches a question id"):
        score_predictions(p, pred)
    np.savez(pred / "q1.npz", visible=np.zeros((4, 5)), amodal=np.zeros((4, 5)))
    with pytest.raises(SuiteFormatError, match=r"q1.npz \(question 'q1'\): float arrays need a 'kind'"):
        score_predictions(p, pred)
    (pred / "predictions.json").write_text(json.dumps({"predictions": {"q1": {"visible": [], "amodal": []}}}))
    with pytest.raises(SuiteFormatError, match=r"\['q1'\] are predicted both"):
        score_predictions(p, pred)
    (pred / "q1.npz").unlink()
    res = score_predictions(p, pred, device="cpu")              # empty predictions: IoU 0 against the GT
    assert res["visible"]["gIoU"] == 0.0 and res["counts"]["unknown_predictions"] == 1


# ----------------------------------------------------------------------------- toy world end to end

@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_amodal_world(tmp_path_factory.mktemp("amodal") / "world", seed=0, n_images=12)


def test_toy_world_mixes_mask_forms(world):
    doc = json.loads((world / "annotations.json").read_text())
    forms = set()
    for inst in doc["instances"]:
        for m in (inst["visible"], inst["amodal"]):
            forms.add("png" if isinstance(m, str) else "poly" if isinstance(m, list) else
                      "rle-str" if isinstance(m["counts"], str) else "rle-list")
    assert forms == {"png", "poly", "rle-str", "rle-list"}
    assert any(len(q["targets"]) > 1 for q in doc["questions"])     # multi-target answers
    assert any(not q["targets"] for q in doc["questions"])          # empty answers
    assert build_amodal_world(world, seed=0, n_images=12) == world  # reused, not rebuilt


def test_toy_world_perfect_and_noisy_predictors(world, tmp_path):
    perfect = score_predictions(world, world / "predictions" / "perfect", device="cpu")
    for role in ("visible", "amodal"):
        assert perfect[role]["gIoU"] == pytest.approx(1.0, abs=1e-4)
        assert perfect[role]["cIoU"] == pytest.approx(1.0, abs=1e-6)
    assert perfect["counts"]["missing_predictions"] == 0
    noisy = score_predictions(world, world / "predictions" / "noisy", device="cpu")
    for role in ("visible", "amodal"):
        assert 0.05 < noisy[role]["gIoU"] < 0.99 and 0.05 < noisy[role]["cIoU"] < 0.99
    # a partial folder: missing questions score as empty predictions
    part = tmp_path / "part"
    shutil.copytree(world / "predictions" / "noisy", part)
    gone = sorted(part.glob("*.npz"))[:3]
    for f in gone:
        f.unlink()
    res = score_predictions(world, part, device="cpu")
    assert res["counts"]["missing_predictions"] == 3
    assert res["counts"]["missing_examples"] == [f.stem for f in gone]


def test_clip_regions_baseline_random_and_oracle_embeddings(world):
    data = load_amodal(world)
    tables = Tables.empty()
    items = clip_regions_items(data, tables)
    assert len(tables.texts) <= len(data.questions) and len(tables.images) == sum(map(len, data.instances.values()))
    ref = tables.images.entries[items.cand_rows[0]]
    assert ref.crop is not None and ref.uri.endswith(".jpg")
    rng = np.random.default_rng(0)
    res = clip_regions(data, items, rng.normal(size=(len(tables.images), 8)), rng.normal(size=(len(tables.texts), 8)),
                       device="cpu")
    for role in ("visible", "amodal"):
        assert 0.0 <= res[role]["gIoU"] <= 1.0 and 0.0 <= res[role]["cIoU"] <= 1.0
    assert res["counts"]["candidates"] == len(items.cand_rows)
    # oracle: each "the <colour> <shape>" question's text embedding equals its target's crop embedding
    img = np.zeros((len(tables.images), len(tables.images)), np.float32)
    img[np.arange(len(img)), np.arange(len(img))] = 1
    txt = np.zeros((len(tables.texts), len(tables.images)), np.float32)
    named = [q for q in data.questions if q.text.startswith("the ")]
    for q in data.questions:
        if q in named:
            k = data.instances[q.image_id].index(q.targets[0])
            pos = data.questions.index(q)
            txt[items.question_rows[pos], items.cand_rows[items.cand_ptr[pos] + k]] = 1
    res = clip_regions(data, items, img, txt, device="cpu")
    iou = dict(zip(res["outcomes"]["question_id"], res["outcomes"]["amodal_iou"]))
    assert all(iou[q.id] == pytest.approx(1.0, abs=1e-4) for q in named)


def test_cli_scores_predictions_without_a_model(world, tmp_path, capsys):
    from hardrank.jobs.cli import main

    out = tmp_path / "res"
    rc = main(["eval", "--suite", "amodal", "--data", str(world), "--predictions",
               str(world / "predictions" / "perfect"), "--out", str(out), "--device", "cpu", "--quiet"])
    assert rc == 0
    result = json.loads((out / "perfect" / "amodal.json").read_text())
    assert result["metrics"]["amodal"]["gIoU"] == pytest.approx(100.0, abs=1e-2)
    assert result["task_type"] == "mask" and (out / "perfect" / "amodal.parquet").is_file()
    assert "visible gIoU" in capsys.readouterr().out
    assert main(["eval", "--suite", "amodal", "--data", str(world), "--out", str(out)]) == 2  # a missing option
    assert "needs --predictions DIR and/or --baseline" in capsys.readouterr().err


def test_cli_clip_regions_baseline_with_a_tiny_model(world, tmp_path):
    from hardrank.jobs.cli import main

    cfg = tmp_path / "tiny-amodal-clip.json"
    cfg.write_text(json.dumps({"embed_dim": 16, "vision_cfg": {"image_size": 32, "layers": 1, "width": 32,
                                                               "head_width": 16, "patch_size": 16},
                               "text_cfg": {"context_length": 16, "vocab_size": 49408, "width": 16, "heads": 2,
                                            "layers": 1}}))
    out = tmp_path / "res"
    rc = main(["eval", "--suite", "amodal", "--data", str(world), "--baseline", "clip-regions", "--model", str(cfg),
               "--random-init",
               "--out", str(out), "--store", str(tmp_path / "store"), "--device", "cpu", "--quiet"])
    assert rc == 0
    files = list(out.glob("*/amodal.json"))
    assert len(files) == 1
    result = json.loads(files[0].read_text())
    assert result["baseline"] == "clip-regions" and result["tie_rule"] == "first-instance"
    for role in ("visible", "amodal"):
        assert 0.0 <= result["metrics"][role]["gIoU"] <= 100.0
