"""BLIP through the engine and ``--rerank itm:K``: equal to transformers' own path and to a brute-force protocol.

The model is a tiny random ``BlipForImageTextRetrieval`` saved locally (``blip_helpers.make_blip``); nothing
is downloaded. The brute force is the RoCOCO reference's loop written plainly: full ITC rows, each query's top
K by (score desc, index asc), one cross-encoder forward per query over its K candidates, -100 elsewhere, ranks
per view by the index tie rule read off the full re-scored row.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from blip_helpers import make_blip
from helpers import make_karpathy_world, pillow_mode_image
from hf_helpers import edit_image_processor, save_processor
from PIL import Image

from hardrank import EmbedOptions, EmbedPipeline, evaluate
from hardrank.config import EvalConfig, build
from hardrank.embed.itm import ItmScorer
from hardrank.encoding.decode import is_processor_cfg
from hardrank.encoding.decoders import make_decoder
from hardrank.errors import DataError, UsageError
from hardrank.items import ImageRef, Tables
from hardrank.jobs.cli import main
from hardrank.kernels import GroupedRanks
from hardrank.models.hf_models import PROCESSOR_KEY
from hardrank.models.load import load_model
from hardrank.models.spec import ModelSpec
from hardrank.scoring.metrics import view_outcomes
from hardrank.scoring.rerank import FILL, RerankSpec, parse, rerank_ranks
from hardrank.suites import SuiteOptions, load_suites
from hardrank.tasks import RankingTask

PHOTO = Path(__import__("matplotlib").get_data_path()) / "sample_data" / "grace_hopper.jpg"
MAX_LEN = 35  # BLIP's caption length (the reference's max_length)
pytestmark = pytest.mark.skipif(not PHOTO.is_file(), reason="matplotlib's sample photograph is not installed")


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """Tiny tensors: on a loaded machine, torch's OpenMP threads spin against other processes (50x slower)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def blip(tmp_path_factory):
    return make_blip(tmp_path_factory.mktemp("blip") / "tiny-blip")


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    """Real photographs: the sample photo and crops of it at other sizes and aspect ratios, as JPEG and PNG."""
    root = tmp_path_factory.mktemp("photos")
    img = Image.open(PHOTO).convert("RGB")
    paths = [PHOTO]
    for i, box in enumerate([(0, 0, 300, 400), (100, 50, 500, 250), (37, 91, 120, 140)]):
        p = root / f"crop{i}.{'png' if i == 1 else 'jpg'}"
        img.crop(box).save(p)
        paths.append(p)
    return paths


# -- BLIP as a dual encoder -----------------------------------------------------------------------------
MODES = ("P", "P-transparent", "PA", "RGBA", "LA", "L", "CMYK-jpeg")  # besides the RGB photographs


@pytest.fixture(scope="module")
def mode_images(tmp_path_factory):
    """Photo-like images in the modes images come in besides RGB (helpers.pillow_mode_image: random alpha and
    a transparent palette index). BLIP's processor converts each to RGB first (alpha onto white) and then
    resizes, so a decoder that resizes in the image's own mode and converts after gives other pixels."""
    root = tmp_path_factory.mktemp("modes")
    out = []
    for name in MODES:
        path, mode = pillow_mode_image(root, name)
        assert Image.open(path).mode == mode
        out.append(path)
    return out


def _reference(folder: Path, images: list[Path], texts: list[str]):
    """transformers' own path: ``AutoImageProcessor`` (its default backend) + ``BlipForImageTextRetrieval``;
    returns (net, tokenizer, pixels, token ids, normalised ITC image and text features)."""
    from transformers import AutoImageProcessor, AutoTokenizer, BlipForImageTextRetrieval

    net = BlipForImageTextRetrieval.from_pretrained(str(folder), local_files_only=True).eval()
    proc = AutoImageProcessor.from_pretrained(str(folder), local_files_only=True)
    tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
    px = proc(images=[Image.open(p) for p in images], return_tensors="pt")["pixel_values"]
    ti = tok(texts, padding="max_length", truncation=True, max_length=35, return_tensors="pt")
    with torch.no_grad():
        cls = net.vision_model(pixel_values=px).last_hidden_state[:, 0]
        img = torch.nn.functional.normalize(net.vision_proj(cls), dim=-1).numpy()
        txt = torch.nn.functional.normalize(net.text_proj(net.text_encoder(
            input_ids=ti.input_ids, attention_mask=ti.attention_mask).last_hidden_state[:, 0]), dim=-1).numpy()
    return net, tok, px, ti, img, txt


def test_blip_itc_and_itm_equal_transformers_own_path(blip, photos, mode_images, tmp_path):
    """Stored ITC embeddings (the embed pipeline) and ITM logits (the re-ranking stage, which decodes the images
    again) equal transformers' processor + model on RGB photographs and on palette, alpha, grey and CMYK images."""
    from transformers import AutoImageProcessor

    images = [*photos, *mode_images]
    texts = ["a dog and a cat on the bus", "a portrait of an officer in uniform", "zebra",
             "two men ride horses near the boat " * 8]  # longer than 35 tokens: truncated
    pipe = EmbedPipeline([ModelSpec(f"blip:{blip}", device="cpu")], EmbedOptions(store=str(tmp_path / "s"),
                                                                                 device="cpu"))
    tables = Tables.empty()
    rows = tables.images.add_many([ImageRef(str(p)) for p in images])
    tables.texts.add_many(texts)
    pipe.run(tables)
    emb = pipe.embeddings(0, tables, np.float32)
    m = pipe.models[0]
    assert is_processor_cfg(m.preprocess_cfg) and m.preprocess_cfg[PROCESSOR_KEY] == json.loads(json.dumps(
        AutoImageProcessor.from_pretrained(str(blip)).to_dict(), default=str))  # what the fingerprint hashes

    net, tok, px, ti, ref_img, ref_txt = _reference(blip, images, texts)
    assert ti.input_ids.shape == (4, 35)
    got = make_decoder(m.preprocess_cfg, threads=2)({"ref": [ImageRef(str(p)) for p in images]})
    assert got["ok"].all() and torch.equal(got["pixels"], px)  # the processor's pixels, bit for bit
    np.testing.assert_allclose(emb["image"][rows], ref_img, atol=1e-5, rtol=0)
    np.testing.assert_allclose(emb["text"], ref_txt, atol=1e-5, rtol=0)
    with torch.no_grad():  # transformers' forward with use_itm_head=False: the cosine of the same two features
        cos = net(input_ids=ti.input_ids, pixel_values=px[:1].expand(4, -1, -1, -1), attention_mask=ti.attention_mask,
                  use_itm_head=False).itm_score
    np.testing.assert_allclose(emb["text"] @ emb["image"][rows[0]], cos[0].numpy(), atol=1e-5, rtol=0)

    # the cross-encoder on every (image, text) pair: the reference's [ENC] first token (this tokenizer has one)
    scorer = ItmScorer(m, tables, batch_size=16)
    pi, pt = np.repeat(rows, len(texts)), np.tile(np.arange(len(texts)), len(rows))
    enc_ids = ti.input_ids.clone()
    enc_ids[:, 0] = tok.convert_tokens_to_ids("[ENC]")
    with torch.no_grad():
        itm_ref = net(input_ids=enc_ids[pt], pixel_values=px[np.searchsorted(rows, pi)],
                      attention_mask=ti.attention_mask[pt], use_itm_head=True).itm_score[:, 1]
    np.testing.assert_allclose(scorer(pi, pt), itm_ref.numpy(), atol=1e-5, rtol=0)
    assert m.info["itm_first_token"] == "[ENC]" and m.label == "tiny-blip"


def test_blip_stores_are_keyed_by_the_processor_settings(tmp_path, blip):
    """The fingerprint (the store folder) hashes the processor's settings: another resample is another store."""
    other = tmp_path / "tiny-blip"
    other.mkdir()
    for f in blip.iterdir():
        (other / f.name).write_bytes(f.read_bytes())
    a = load_model(ModelSpec(f"blip:{other}", device="cpu"))
    edit_image_processor(other, resample=2)
    b = load_model(ModelSpec(f"blip:{other}", device="cpu"))
    assert b.preprocess_cfg[PROCESSOR_KEY]["resample"] == 2 and b.fingerprint != a.fingerprint
    with pytest.raises(UsageError, match="--decoder dali: transformers models"):
        make_decoder(a.preprocess_cfg, "dali")


def test_blip_without_enc_token_keeps_cls_as_transformers(tmp_path, photos):
    from transformers import AutoImageProcessor, BlipForImageTextRetrieval

    folder = make_blip(tmp_path / "noenc", enc_token=False)
    m = load_model(ModelSpec(f"blip:{folder}", device="cpu"))
    assert m.info["itm_first_token"] == "[CLS]"
    net = BlipForImageTextRetrieval.from_pretrained(str(folder), local_files_only=True).eval()
    px = AutoImageProcessor.from_pretrained(str(folder))([Image.open(photos[0])], return_tensors="pt")
    ids = m.tokenizer(["a dog and a cat"])
    with torch.no_grad():
        ref = net(input_ids=ids, pixel_values=px["pixel_values"], attention_mask=(ids != 0).long()).itm_score[:, 1]
        ours = m.model.itm(ids, m.model.vision_states(px["pixel_values"]))
    np.testing.assert_allclose(ours.numpy(), ref.numpy(), atol=1e-5, rtol=0)


@pytest.mark.parametrize("variant", ["transformers4", "sharded"])
def test_blip_folders_of_every_layout_are_the_same_model(variant, blip, photos, tmp_path):
    """The same weights and processor saved in transformers 4's layout (preprocessor_config.json) or in shards
    (model.safetensors.index.json) give the embeddings of the transformers 5 folder (processor_config.json)."""
    from transformers import AutoProcessor, BlipForImageTextRetrieval

    other = tmp_path / "tiny-blip"  # the fixture's model and processor, loaded and saved again as users do
    BlipForImageTextRetrieval.from_pretrained(str(blip)).save_pretrained(
        other, **({"max_shard_size": "50KB"} if variant == "sharded" else {}))
    save_processor(other, AutoProcessor.from_pretrained(str(blip)), "4" if variant == "transformers4" else "5")
    if variant == "sharded":
        assert len(list(other.glob("model-*-of-*.safetensors"))) > 2 and not (other / "model.safetensors").exists()
    else:
        assert (other / "preprocessor_config.json").is_file() and not (other / "processor_config.json").exists()
    texts = ["a dog and a cat on the bus", "zebra"]

    def embed(folder):
        pipe = EmbedPipeline([ModelSpec(f"blip:{folder}", device="cpu")],
                             EmbedOptions(store=str(tmp_path / f"s-{folder.parent.name}"), device="cpu"))
        tables = Tables.empty()
        tables.images.add_many([ImageRef(str(p)) for p in photos[:2]])
        tables.texts.add_many(texts)
        pipe.run(tables)
        return pipe.embeddings(0, tables, np.float32)

    ref, got = embed(blip), embed(other)
    for kind in ("image", "text"):
        np.testing.assert_allclose(got[kind], ref[kind], atol=1e-6, rtol=0)


def test_blip_trainer_checkpoint_loads_as_model_and_as_checkpoint(blip, photos, tmp_path):
    """One step of a Trainer fine-tuning the ITM head (its compute_loss: cross-entropy of itm_score, as users
    write it) saves checkpoint-1/ with the processor; it loads as --model blip:checkpoint-1 and as --checkpoint
    of the model it was trained from, both equal to transformers' own path on the trained weights."""
    pytest.importorskip("accelerate")  # transformers' Trainer needs it
    from transformers import AutoProcessor, BlipForImageTextRetrieval, Trainer, TrainingArguments

    processor = AutoProcessor.from_pretrained(str(blip), local_files_only=True)

    class Pairs(torch.utils.data.Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            text = processor.tokenizer(["a dog and a cat on the bus", "zebra"][i], padding="max_length",
                                       max_length=MAX_LEN, truncation=True, return_tensors="pt")
            return {"input_ids": text["input_ids"][0], "attention_mask": text["attention_mask"][0],
                    "pixel_values": torch.rand(3, 32, 32), "labels": torch.tensor(i % 2)}

    class ItmTrainer(Trainer):
        def compute_loss(self, model, inputs, return_outputs=False, **kwargs):
            labels = inputs.pop("labels")
            out = model(**inputs, use_itm_head=True)
            loss = torch.nn.functional.cross_entropy(out.itm_score, labels)
            return (loss, out) if return_outputs else loss

    args = TrainingArguments(output_dir=str(tmp_path / "run"), max_steps=1, save_steps=1, per_device_train_batch_size=2,
                             report_to=[], use_cpu=True, remove_unused_columns=False, learning_rate=0.05)
    ItmTrainer(model=BlipForImageTextRetrieval.from_pretrained(str(blip)), args=args, train_dataset=Pairs(),
               processing_class=processor).train()
    ckpt = tmp_path / "run" / "checkpoint-1"
    assert {"training_args.bin", "optimizer.pt", "model.safetensors"} <= {p.name for p in ckpt.iterdir()}
    *_, ref_img, ref_txt = _reference(ckpt, photos[:2], ["zebra"])
    for spec in (ModelSpec(f"blip:{ckpt}", device="cpu"), ModelSpec(f"blip:{blip}", str(ckpt), device="cpu")):
        m = load_model(spec)
        with torch.no_grad():
            px = make_decoder(m.preprocess_cfg)({"ref": [ImageRef(str(p)) for p in photos[:2]]})["pixels"]
            img = torch.nn.functional.normalize(m.model.encode_image(px), dim=-1).numpy()
            txt = torch.nn.functional.normalize(m.model.encode_text(m.tokenizer(["zebra"])), dim=-1).numpy()
        np.testing.assert_allclose(img, ref_img, atol=1e-5, rtol=0)
        np.testing.assert_allclose(txt, ref_txt, atol=1e-5, rtol=0)
    untrained = _reference(blip, photos[:2], ["zebra"])[-2]
    assert float(np.abs(untrained - ref_img).max()) > 1e-3  # the step changed the weights


def test_blip_folder_errors(tmp_path, blip):
    with pytest.raises(DataError, match="not a BLIP config"):
        (tmp_path / "x").mkdir()
        (tmp_path / "x" / "config.json").write_text(json.dumps({"model_type": "clip"}))
        load_model(ModelSpec(f"blip:{tmp_path / 'x'}", device="cpu"))
    with pytest.raises(DataError, match="not in the local Hugging Face cache"):
        load_model(ModelSpec("blip:nobody/no-such-blip", device="cpu"))
    with pytest.raises(DataError, match=r"holds no image processor settings \(preprocessor_config.json, or "
                                        r"processor_config.json with an image_processor.*processor.save_pretrained"):
        (tmp_path / "y").mkdir()
        (tmp_path / "y" / "config.json").write_text((blip / "config.json").read_text())
        load_model(ModelSpec(f"blip:{tmp_path / 'y'}", device="cpu"))


# -- the re-ranking protocol: engine == brute force -----------------------------------------------------
def _brute_force(task: RankingTask, q_emb, g_emb, itm, k: int, tol: float = 0.0) -> dict[str, dict[str, np.ndarray]]:
    """Per query: the full ITC row, the top k by (score desc, index asc), itm + s there and -100 elsewhere,
    then per view the rank of the best positive and the top-1 under the index tie rule. ``tol`` > 0: also the
    rank's bounds ``lo``/``hi`` when scores within ``tol`` of the best positive's may fall either way (a network's
    logits move by an ulp with the batch and thread count that computed them)."""
    xq, xb = q_emb[task.query_items].astype(np.float64), g_emb[task.gallery_items].astype(np.float64)
    nb = len(xb)
    out = {v: {"rank": [], "top1": [], "lo": [], "hi": []} for v in task.views}
    for i in range(task.num_queries):
        s = (xq[i] @ xb.T).astype(np.float32)  # exact here: the test's embeddings are small dyadic numbers
        order = sorted(range(nb), key=lambda j: (-float(s[j]), j))[:k]
        row = np.full(nb, FILL, dtype=np.float32)
        q, cand = np.full(len(order), task.query_items[i]), task.gallery_items[order]
        logit = itm(q, cand) if task.query_modality == "image" else itm(cand, q)  # the reference: a forward per query
        row[order] = logit.astype(np.float32) + s[order]
        pos = set(task.pos_idx[task.pos_ptr[i]:task.pos_ptr[i + 1]].tolist())
        for v, groups in task.views.items():
            items = [j for g in groups for j in range(task.group_bounds[task.groups.index(g)],
                                                         task.group_bounds[task.groups.index(g) + 1])]
            ranked = sorted(items, key=lambda j: (-float(row[j]), j))  # index tie rule: a stable order
            best = next(r for r, j in enumerate(ranked) if j in pos)
            out[v]["rank"].append(sum(1 for j in ranked[:best] if j not in pos))
            jb, b = ranked[best], float(row[ranked[best]])  # exact ties keep the index rule; near ones are open
            other = [float(row[j]) for j in items if j not in pos]
            before = sum(1 for j in items
                         if j not in pos and (float(row[j]) > b + tol or (float(row[j]) == b and j < jb)))
            near = sum(1 for x in other if x != b and abs(x - b) <= tol)
            out[v]["lo"].append(before)
            out[v]["hi"].append(before + near)
            out[v]["top1"].append(ranked[best] if best == 0 or all(j in pos for j in ranked[:best])
                                  else next(j for j in ranked if j not in pos))
    return {v: {k2: np.array(x) for k2, x in d.items()} for v, d in out.items()}


def _toy_task(rng, nq=7, sizes=(9, 6, 5), d=6):
    """A task with three groups (views original, +a, +b), duplicated gallery rows (exact ITC ties, at the
    K-th place too) and two positives for some queries. Embeddings are multiples of 1/8: exact dot products."""
    nb = sum(sizes)
    gallery = rng.integers(-4, 5, size=(nb - 6, d)) / 8
    gallery = np.concatenate([gallery, gallery[[0, 1, 2, 9, 10, 13]]])  # duplicates in other groups
    queries = rng.integers(-4, 5, size=(nq, d)) / 8
    bounds = np.cumsum([0, *sizes])
    pos = [sorted({int(i % sizes[0]), int((3 * i + 1) % sizes[0])}) for i in range(nq)]
    task = RankingTask("t2i", "text", np.arange(nq), [f"q{i}" for i in range(nq)], ["original", "a", "b"], bounds,
                       np.arange(nb), [f"g{j}" for j in range(nb)], np.cumsum([0, *map(len, pos)]),
                       np.array([p for ps in pos for p in ps]),
                       {"original": ["original"], "a": ["original", "a"], "b": ["original", "b"],
                        "all": ["original", "a", "b"]})
    task.validate()
    return task, queries.astype(np.float32), gallery.astype(np.float32)


def _itm_of(gallery):
    """A cross-encoder stand-in: a fixed function of the pair's (image row, text row), equal for duplicated
    images (their embedding rows are equal), in quarters so some re-scored sums tie exactly."""
    def itm(image_rows, text_rows):
        g = gallery[np.asarray(image_rows)]
        return (np.round(4 * np.sin(3 * g.sum(1) + np.asarray(text_rows))) / 4).astype(np.float32)
    return itm


@pytest.mark.parametrize("k", [1, 2, 5, 8, 19, 20, 64])
def test_rerank_equals_brute_force_protocol(k):
    rng = np.random.default_rng(k)
    task, q, g = _toy_task(rng)
    itm = _itm_of(g)
    calls = []
    ranks = rerank_ranks(task, q, g, lambda a, b: calls.append(len(a)) or itm(a, b), RerankSpec("itm", k),
                         pair_batch=8)
    ref = _brute_force(task, q, g, itm, k)
    for view in task.views:
        o = view_outcomes(task, ranks, view)
        np.testing.assert_array_equal(o["rank"], ref[view]["rank"], err_msg=f"k={k} view={view}")
        np.testing.assert_array_equal(o["top1"], ref[view]["top1"], err_msg=f"k={k} view={view}")
    k_used = min(k, len(g))
    assert ranks.info["k_used"] == k_used and ranks.info["pairs"] == task.num_queries * k_used
    assert sum(calls) == task.num_queries * k_used and max(calls) <= 8  # batched, pair_batch pairs per call


def test_ties_at_the_kth_score_admit_the_lower_gallery_index():
    """Gallery rows 0 and 3 are equal: with K = 2 after row 1, the K-th place is a tie and row 0 enters."""
    q = np.array([[1.0, 0.0]], dtype=np.float32)
    g = np.array([[0.5, 0.0], [1.0, 0.0], [0.0, 1.0], [0.5, 0.0]], dtype=np.float32)
    task = RankingTask("t2i", "text", np.arange(1), ["q"], ["original"], np.array([0, 4]), np.arange(4),
                       list("abcd"), np.array([0, 1]), np.array([3]), {"original": ["original"]})
    ranks = rerank_ranks(task, q, g, lambda a, b: np.full(len(a), 10.0, np.float32), RerankSpec("itm", 2))
    # re-scored: row1 = 11.0, row0 = 10.5 (entered), row3 (the positive, tied at the K-th score) = -100,
    # row2 = -100 and before it in gallery order: the index rule ranks it above the positive
    assert int(view_outcomes(task, ranks, "original")["rank"][0]) == 3
    assert float(ranks.pos_score[0]) == FILL


def test_rerank_parse_errors():
    assert parse("itm:256") == RerankSpec("itm", 256) and parse(None) is None
    for bad in ("itm", "itm:", "itm:x", "ce:5", "itm:5:6", "256"):
        with pytest.raises(UsageError, match="expected itm:K"):
            parse(bad)
    for bad in ("itm:0", "itm:-3"):
        with pytest.raises(UsageError, match="K must be at least 1"):
            parse(bad)


# -- end to end: evaluate --model blip: --rerank itm:K ------------------------------------------------------
@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return make_karpathy_world(tmp_path_factory.mktemp("bworld"), n_images=4)


def _cfg(world, blip, tmp_path, **kw):
    opts = SuiteOptions(annotations=str(world["annotations"]), images=str(world["images"]),
                        image_variants=("mix_0.9",), seeds=(1,))
    base = dict(model=f"blip:{blip}", suites=("rococo",), out=str(tmp_path / "out"), store=str(tmp_path / "store"),
                suite_options=opts, batch_size=16, device="cpu")
    base.update(kw)
    return build(EvalConfig, base)


@pytest.mark.parametrize("k", [3, 16, 1000])
def test_evaluate_rerank_equals_brute_force_with_transformers(world, blip, tmp_path, k):
    """Engine (store, decoder, batched cross-encoder) == the reference loop on transformers' own features."""
    from transformers import AutoImageProcessor, AutoTokenizer, BlipForImageTextRetrieval

    rep = evaluate(_cfg(world, blip, tmp_path, rerank=f"itm:{k}"))
    res = rep.results[0]
    assert res["rerank"]["spec"] == f"itm:{k}" and res["rerank"]["itm_first_token"] == "[ENC]"
    assert res["rerank"]["candidates"].startswith("score desc, then lower gallery index")
    outcomes = pq.read_table(next(p for p in rep.files if p.suffix == ".parquet")).to_pandas()

    tables = Tables.empty()
    suite = load_suites(["rococo"], tables, _cfg(world, blip, tmp_path).suite_options)[0]
    net = BlipForImageTextRetrieval.from_pretrained(str(blip), local_files_only=True).eval()
    proc = AutoImageProcessor.from_pretrained(str(blip))
    tok = AutoTokenizer.from_pretrained(str(blip))
    with torch.no_grad():
        px = proc([Image.open(r.uri) for r in tables.images.entries], return_tensors="pt")["pixel_values"]
        feats = net.vision_model(pixel_values=px).last_hidden_state
        img = torch.nn.functional.normalize(net.vision_proj(feats[:, 0]), dim=-1).numpy()
        ti = tok(list(tables.texts.entries), padding="max_length", truncation=True, max_length=35, return_tensors="pt")
        txt = torch.nn.functional.normalize(net.text_proj(net.text_encoder(
            input_ids=ti.input_ids, attention_mask=ti.attention_mask).last_hidden_state[:, 0]), dim=-1).numpy()
    enc_ids = ti.input_ids.clone()
    enc_ids[:, 0] = tok.convert_tokens_to_ids("[ENC]")

    def itm(image_rows, text_rows):
        with torch.no_grad():
            out = net.text_encoder(input_ids=enc_ids[text_rows], attention_mask=ti.attention_mask[text_rows],
                                   encoder_hidden_states=feats[image_rows])
            return net.itm_head(out.last_hidden_state[:, 0])[:, 1].numpy()

    # batched, and each image's vision states computed once (cached) although it is a candidate of many queries
    ce = res["rerank"]["cross_encoder"]
    assert ce["pairs"] == sum(t.num_queries * min(k, len(t.gallery_items)) for t in suite.ranking)
    assert ce["forwards"] < ce["pairs"] and ce["images_encoded"] <= len(tables.images)
    if k == 1000:
        assert ce["images_encoded"] == len(tables.images) and ce["image_cache_hits"] > 0
    emb = {"image": img, "text": txt}
    for task in suite.ranking:
        ref = _brute_force(task, emb[task.query_modality], emb[task.gallery_modality], itm, k, tol=1e-4)
        for view in task.views:
            got = outcomes[(outcomes.task == task.name) & (outcomes.view == view)]["rank"].to_numpy()
            lo, hi = ref[view]["lo"], ref[view]["hi"]
            near = lo != hi  # a score within 1e-4 of the best positive's: its side is the last ulp's
            assert near.mean() <= 0.5, (task.name, view, near.mean())  # most queries still checked exactly
            np.testing.assert_array_equal(got[~near], ref[view]["rank"][~near], err_msg=f"{task.name} {view}")
            assert ((lo <= got) & (got <= hi)).all(), (task.name, view, got, lo, hi)
            assert res["metrics"][view][task.name]["R@1"] == pytest.approx(100 * np.mean(got < 1))


def test_rerank_refuses_models_without_an_itm_head_and_bad_values(world, tmp_path, capsys):
    from helpers import write_tiny_config
    cfg = write_tiny_config(tmp_path)
    with pytest.raises(UsageError, match="has no image-text matching head"):
        evaluate(_cfg(world, "x", tmp_path, model=str(cfg), random_init=True, rerank="itm:5"))
    base = ["eval", "--suite", "rococo", "--annotations", str(world["annotations"]), "--out", str(tmp_path / "o"),
            "--model", str(cfg), "--random-init", "--store", str(tmp_path / "s")]
    for value, msg in (("itm:0", "K must be at least 1"), ("itm", "expected itm:K")):
        assert main([*base, "--rerank", value]) == 2
        assert msg in capsys.readouterr().err
    assert main([*base, "--rerank", "itm:4"]) == 2
    assert "has no image-text matching head" in capsys.readouterr().err


def test_rerank_ranks_are_grouped_ranks():
    """The stage returns the kernels' contract (what scoring.metrics reads)."""
    task, q, g = _toy_task(np.random.default_rng(0))
    r = rerank_ranks(task, q, g, _itm_of(g), RerankSpec("itm", 3))
    assert isinstance(r, GroupedRanks) and r.counts.shape == (task.num_queries, 3)


def test_rerank_refuses_options_that_bring_no_cross_encoder_or_an_inexact_first_stage(tmp_path):
    base = {"suites": ("toy",), "rerank": "itm:3"}
    cases = (({"embeddings": str(tmp_path / "e.parquet")}, "precomputed --embeddings bring none"),
             ({"search": "faiss:Flat"}, "drop --search faiss:Flat"),
             ({"shard_gallery": 2}, "drop --shard-gallery"))
    for extra, msg in cases:
        with pytest.raises(UsageError, match=msg):
            EvalConfig(**base, **extra)
    assert EvalConfig(**base).rerank_spec == RerankSpec("itm", 3)
