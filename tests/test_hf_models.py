"""transformers dual encoders (``--model hf:FOLDER``): tiny random CLIPModel / SiglipModel / Siglip2Model folders
built here.

What hardrank embeds must equal transformers' own path: the folder's image processor on ``Image.open``'s
image + ``get_image_features``, its tokenizer padded as the model was trained + ``get_text_features``,
normalised. Images are photo-like (a real photograph, gradients with noise) at several sizes, aspect
ratios and modes, so the processor's resize, crop and RGB conversion all matter.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import empty_hf_cache_no_network
from hf_helpers import (
    LAYOUTS,
    LENGTH,
    SENTENCES,
    edit_image_processor,
    image_processor_settings,
    make_clip,
    make_siglip,
    make_siglip2,
)
from PIL import Image
from transformers import (
    BertConfig,
    CLIPModel,
    Siglip2Processor,
    SiglipImageProcessor,
)

import hardrank
from hardrank.errors import DataError, MissingExtra, UsageError
from hardrank.jobs.cli import main
from hardrank.models.runs import user_specs
from hardrank.toyworld import WorldConfig, build_world

PHOTO = Path(__import__("matplotlib").get_data_path()) / "sample_data" / "grace_hopper.jpg"
CAPTIONS = ["a portrait of an officer in uniform", "A Dog, and a CAT on the bus!", "zebra",
            "two men ride horses near the boat " * 6,  # longer than the context: truncated
            "pizza   on\ta table"]


def photos(folder: Path) -> list[Path]:
    """Photo-like images: smooth gradients with sensor-like noise and a blurred blob, at sizes and aspect
    ratios that make the resize and crop round differently, in the modes photos come in; plus a real JPEG."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    out = []
    for i, ((w, h), mode, ext) in enumerate([((97, 61), "RGB", "jpg"), ((45, 130), "RGB", "png"),
                                             ((200, 151), "L", "jpg"), ((64, 33), "RGBA", "png"),
                                             ((71, 71), "P", "png"), ((33, 90), "CMYK", "jpg")]):
        y, x = np.mgrid[0:h, 0:w] / max(w, h)
        base = np.stack([x, y, 1 - x * y], -1) * 200 + 20
        blob = 40 * np.exp(-(((x - 0.4) ** 2 + (y - 0.5) ** 2) / 0.02))[..., None]
        arr = np.clip(base + blob + rng.normal(0, 6, (h, w, 3)), 0, 255).astype(np.uint8)
        img = Image.fromarray(arr)
        if mode == "RGBA":
            img.putalpha(Image.fromarray((np.linspace(60, 255, w)[None].repeat(h, 0)).astype(np.uint8)))
        elif mode != "RGB":
            img = img.convert(mode)
        p = folder / f"photo{i}.{ext}"
        img.save(p, quality=90) if ext == "jpg" else img.save(p)
        out.append(p)
    if PHOTO.is_file():
        out.append(PHOTO)
    return out


def reference(folder: Path, images: list[Path], texts: list[str]):
    """transformers' own path: AutoImageProcessor / AutoTokenizer from the folder, the model's get_*_features."""
    from transformers import AutoImageProcessor, AutoModel, AutoTokenizer

    model = AutoModel.from_pretrained(str(folder)).eval()
    proc, tok = AutoImageProcessor.from_pretrained(str(folder)), AutoTokenizer.from_pretrained(str(folder))
    with torch.no_grad():
        img = model.get_image_features(**proc(images=[Image.open(p) for p in images], return_tensors="pt")
                                       ).pooler_output if images else torch.zeros(0, 1)
        tokens = tok(texts, padding="max_length", max_length=LENGTH, truncation=True, return_tensors="pt")
        if model.config.model_type in ("siglip", "siglip2"):  # as trained: the padded ids, unmasked (hf_models)
            tokens = {"input_ids": tokens["input_ids"]}
        txt = model.get_text_features(**tokens)
    n = torch.nn.functional.normalize
    return n(img, dim=-1).numpy(), n(txt.pooler_output, dim=-1).numpy()


def hardrank_embed(spec: hardrank.ModelSpec, store: Path, images: list[Path], texts: list[str], runner=None,
                   **options):
    pipe = hardrank.EmbedPipeline([spec], hardrank.EmbedOptions(store=str(store), device="cpu", **options),
                                  runner=runner)
    tables = hardrank.Tables.empty()
    for p in images:
        tables.images.add(hardrank.ImageRef(str(p)))
    for c in texts:
        tables.texts.add(c)
    pipe.run(tables)
    emb = pipe.embeddings(0, tables, np.float32)
    return emb["image"], emb["text"], pipe.models[0]


def _close(a, b, tol=1e-5):
    assert a.shape == b.shape and float(np.abs(a - b).max()) < tol, float(np.abs(a - b).max())


@pytest.fixture()
def offline(tmp_path, monkeypatch):
    """An empty Hugging Face cache and a network that refuses (and counts) every connection."""
    return empty_hf_cache_no_network(tmp_path / "hub", monkeypatch)


@pytest.mark.parametrize("layout", LAYOUTS, ids=["transformers5", "transformers4"])
@pytest.mark.parametrize("make", [make_clip, make_siglip], ids=["clip", "siglip"])
def test_embeddings_equal_transformers_own_path(make, layout, tmp_path, offline):
    """Folders saved as users save them (model.save_pretrained + XProcessor.save_pretrained), in the layout of
    the installed transformers 5 (one processor_config.json, the image processor nested) and of transformers 4
    (preprocessor_config.json), embed as transformers' own path."""
    folder = make(tmp_path / "model", layout=layout)
    assert (folder / ("processor_config.json" if layout == "5" else "preprocessor_config.json")).is_file()
    assert not (folder / ("preprocessor_config.json" if layout == "5" else "processor_config.json")).exists()
    images = photos(tmp_path / "img")
    img, txt, m = hardrank_embed(hardrank.ModelSpec(f"hf:{folder}", device="cpu"), tmp_path / "s", images, CAPTIONS)
    ref_img, ref_txt = reference(folder, images, CAPTIONS)
    _close(img, ref_img)
    _close(txt, ref_txt)
    assert m.tokenizer(CAPTIONS)["input_ids"].shape == (len(CAPTIONS), LENGTH)  # padded to the trained length
    assert m.info["transformers"]["class"] == ("CLIPModel" if make is make_clip else "SiglipModel")
    assert offline["tries"] == []


def test_sharded_weights_and_trainer_checkpoints_load(tmp_path, offline):
    """A model saved in shards (model.safetensors.index.json + model-0000k-of-0000n.safetensors) embeds as the
    same model in one file, its fingerprint hashing every shard; a Trainer's checkpoint-N/ folder (saved with its
    processor) loads as --model hf:checkpoint-N and as a --checkpoint of the model it was trained from."""
    pytest.importorskip("accelerate")  # transformers' Trainer needs it
    from transformers import AutoProcessor, Trainer, TrainingArguments

    whole, sharded = make_clip(tmp_path / "whole"), tmp_path / "sharded"
    CLIPModel.from_pretrained(str(whole)).save_pretrained(sharded, max_shard_size="20KB")
    AutoProcessor.from_pretrained(str(whole)).save_pretrained(sharded)
    shards = sorted(p.name for p in sharded.glob("model-*.safetensors"))
    assert len(shards) > 2 and (sharded / "model.safetensors.index.json").is_file()
    images = photos(tmp_path / "img")[:2]
    ref = hardrank_embed(hardrank.ModelSpec(f"hf:{whole}", device="cpu"), tmp_path / "s0", images, CAPTIONS)
    got = hardrank_embed(hardrank.ModelSpec(f"hf:{sharded}", device="cpu"), tmp_path / "s1", images, CAPTIONS)
    _close(got[0], ref[0], 1e-6)
    _close(got[1], ref[1], 1e-6)
    assert got[2].checkpoint_hash != ref[2].checkpoint_hash  # the index and each shard are hashed
    (sharded / shards[-1]).write_bytes((sharded / shards[-1]).read_bytes()[:-4] + b"\0\0\0\1")
    assert hardrank.load_model(hardrank.ModelSpec(f"hf:{sharded}", device="cpu")).checkpoint_hash \
        != got[2].checkpoint_hash

    # one training step of the whole model, saved by the Trainer with its processor (processing_class)
    processor = AutoProcessor.from_pretrained(str(whole), local_files_only=True)

    class Pairs(torch.utils.data.Dataset):
        def __len__(self):
            return 2

        def __getitem__(self, i):
            ids = processor.tokenizer(SENTENCES[i], padding="max_length", max_length=LENGTH, truncation=True,
                                      return_tensors="pt")
            return {"input_ids": ids["input_ids"][0], "attention_mask": ids["attention_mask"][0],
                    "pixel_values": torch.rand(3, 32, 32)}

    def collate(batch):
        return {**{k: torch.stack([b[k] for b in batch]) for k in batch[0]}, "return_loss": True}

    args = TrainingArguments(output_dir=str(tmp_path / "run"), max_steps=1, save_steps=1, per_device_train_batch_size=2,
                             report_to=[], use_cpu=True, remove_unused_columns=False, learning_rate=0.1)
    Trainer(model=CLIPModel.from_pretrained(str(whole)), args=args, train_dataset=Pairs(), data_collator=collate,
            processing_class=processor).train()
    ckpt = tmp_path / "run" / "checkpoint-1"
    assert {"training_args.bin", "optimizer.pt", "model.safetensors", "processor_config.json"} <= {
        p.name for p in ckpt.iterdir()}
    as_model = hardrank_embed(hardrank.ModelSpec(f"hf:{ckpt}", device="cpu"), tmp_path / "s2", images, CAPTIONS)
    as_ckpt = hardrank_embed(hardrank.ModelSpec(f"hf:{whole}", str(ckpt), device="cpu"), tmp_path / "s3", images,
                             CAPTIONS)
    trained = reference(ckpt, images, CAPTIONS)
    for emb in (as_model, as_ckpt):
        _close(emb[0], trained[0])
        _close(emb[1], trained[1])
    assert float(np.abs(as_model[0] - ref[0]).max()) > 1e-3  # the step changed the weights
    assert offline["tries"] == []


def test_pixels_equal_the_processor_exactly(tmp_path):
    """The decode stage's pixels are the processor's, bit for bit, whatever the thread split."""
    from transformers import AutoImageProcessor

    from hardrank.encoding.decoders import make_decoder

    folder = make_clip(tmp_path / "model", crop=24)
    images = photos(tmp_path / "img")
    m = hardrank.load_model(hardrank.ModelSpec(f"hf:{folder}", device="cpu"))
    ref = AutoImageProcessor.from_pretrained(str(folder))(images=[Image.open(p) for p in images],
                                                          return_tensors="pt")["pixel_values"]
    for threads in (1, 3):
        got = make_decoder(m.preprocess_cfg, threads=threads)({"ref": [hardrank.ImageRef(str(p)) for p in images]})
        assert got["ok"].all() and torch.equal(got["pixels"], ref)


def test_k_checkpoints_folders_and_files_and_the_fingerprint(tmp_path):
    """--model hf:FOLDER --checkpoint A/ B.safetensors: each checkpoint's weights with the folder's processor
    and tokenizer; each its own store folder; the processor settings are part of the fingerprint."""
    folder = make_clip(tmp_path / "model", seed=0)
    other = make_clip(tmp_path / "ckpt-1", seed=1)
    images = photos(tmp_path / "img")[:3]
    (tmp_path / "step1.safetensors").write_bytes((other / "model.safetensors").read_bytes())
    specs = user_specs(str(folder), [str(other), str(tmp_path / "step1.safetensors"), None], device="cpu")
    assert [s.arch for s in specs] == [f"hf:{folder}"] * 3  # a bare transformers folder is spelled hf:
    pipe = hardrank.EmbedPipeline(specs, hardrank.EmbedOptions(store=str(tmp_path / "s"), device="cpu"))
    tables = hardrank.Tables.empty()
    for p in images:
        tables.images.add(hardrank.ImageRef(str(p)))
    for c in CAPTIONS:
        tables.texts.add(c)
    pipe.run(tables)
    embs = [pipe.embeddings(i, tables, np.float32) for i in range(3)]
    ref1, ref0 = reference(other, images, CAPTIONS), reference(folder, images, CAPTIONS)
    for e, (ri, rt) in zip(embs, [ref1, ref1, ref0]):
        _close(e["image"], ri)
        _close(e["text"], rt)
    fps = [m.fingerprint for m in pipe.models]
    assert fps[0] == fps[1] != fps[2] and pipe.labels == ["ckpt-1", "step1", "model"]
    # the same weights, another crop: another store folder
    edit_image_processor(folder, resample=2)
    assert hardrank.load_model(specs[2]).fingerprint != fps[2]


@pytest.mark.parametrize("make", [make_clip, make_siglip2], ids=["clip", "siglip2"])
def test_low_precision_as_open_clip_models(make, tmp_path):
    """Precision is handled as for open_clip models: the weights and pixels in bf16 (fp16 on a GPU), close
    to fp32, stored in their own folder (SigLIP 2: its patches in bf16, its patch mask and grid as integers)."""
    folder = make(tmp_path / "model")
    images = photos(tmp_path / "img")[:3]
    ref_img, ref_txt, _ = hardrank_embed(hardrank.ModelSpec(f"hf:{folder}", device="cpu"), tmp_path / "s0", images,
                                         CAPTIONS)
    img, txt, m = hardrank_embed(hardrank.ModelSpec(f"hf:{folder}", precision="bf16", device="cpu"), tmp_path / "s1",
                                 images, CAPTIONS)
    assert m.precision == "bf16" and next(m.model.parameters()).dtype == torch.bfloat16
    _close(img, ref_img, 5e-2)
    _close(txt, ref_txt, 5e-2)
    assert "-bf16-" in m.fingerprint
    if make is make_siglip2:  # the patches go to the model in its dtype; the mask and the grid stay integers
        from hardrank.encoding.decoders import make_decoder
        from hardrank.encoding.encode import _to_device

        px = _to_device(make_decoder(m.preprocess_cfg)({"ref": [hardrank.ImageRef(str(images[0]))]})["pixels"], m)
        assert {k: v.dtype for k, v in px.items()} == {"pixel_values": torch.bfloat16,
                                                       "pixel_attention_mask": torch.int32,
                                                       "spatial_shapes": torch.int64}


@pytest.mark.slow
def test_the_ray_executor_stores_what_the_local_one_does(tmp_path):
    """Through Ray's actors (one session for both): CLIP's pixel tensor, and SigLIP 2's dict of arrays."""
    pytest.importorskip("ray")
    from hardrank.embed.pipeline import make_runner

    images = photos(tmp_path / "img")[:3]
    runner = make_runner(hardrank.EmbedOptions(executor="ray", device="cpu"), [])
    try:
        for make in (make_clip, make_siglip2):
            spec = hardrank.ModelSpec(f"hf:{make(tmp_path / make.__name__)}", device="cpu")
            ref_img, ref_txt, _ = hardrank_embed(spec, tmp_path / f"{make.__name__}-local", images, CAPTIONS)
            img, txt, _ = hardrank_embed(spec, tmp_path / f"{make.__name__}-ray", images, CAPTIONS, runner=runner,
                                         executor="ray")
            _close(img, ref_img, 1e-6)
            _close(txt, ref_txt, 1e-6)
    finally:
        runner.close()


def test_eval_karpathy_on_the_toy_world(tmp_path, capsys):
    world = Path(build_world(tmp_path / "world", WorldConfig(n_train=0, n_test=12, n_inpaint=0)))
    folder = make_clip(tmp_path / "tiny-clip")
    out = tmp_path / "o"
    rc = main(["eval", "--model", f"hf:{folder}", "--suite", "karpathy", "--annotations",
               str(world / "karpathy_test.json"), "--images", str(world / "images"), "--out", str(out), "--store",
               str(tmp_path / "s"), "--device", "cpu", "--quiet"])
    assert rc == 0, capsys.readouterr().err
    result = json.loads((out / "tiny-clip" / "karpathy.json").read_text())
    assert result["provenance"]["architecture"] == "hf:tiny-clip"
    assert result["model_fingerprint"].startswith("hf-tiny-clip-fp32-")
    assert result["provenance"]["model_source"]["transformers"]["class"] == "CLIPModel"
    ((view, metrics),) = result["metrics"].items()
    assert view == "original" and "R@1" in metrics["i2t"] and "R@1" in metrics["t2i"], result["metrics"]
    # the rerun takes every embedding from the store
    rc = main(["eval", "--model", f"hf:{folder}", "--suite", "karpathy", "--annotations",
               str(world / "karpathy_test.json"), "--images", str(world / "images"), "--out", str(tmp_path / "o2"),
               "--store", str(tmp_path / "s"), "--device", "cpu", "--quiet"])
    again = json.loads((tmp_path / "o2" / "tiny-clip" / "karpathy.json").read_text())
    assert rc == 0 and again["metrics"] == result["metrics"]


def _eval_rc(model: str, tmp_path: Path, capsys, *extra) -> tuple[int, str]:
    from helpers import make_karpathy_world

    w = make_karpathy_world(tmp_path / f"w{len(list(tmp_path.glob('w*')))}", n_images=2)
    rc = main(["eval", "--model", model, *extra, "--suite", "karpathy", "--annotations", str(w["annotations"]),
               "--images", str(w["images"]), "--out", str(tmp_path / "o"), "--store", str(tmp_path / "s"), "--quiet"])
    return rc, capsys.readouterr().err


def test_a_folder_that_is_no_model_names_the_folder_and_the_fix(tmp_path, capsys):
    empty = tmp_path / "nothing"
    empty.mkdir()
    (empty / "weights.bin").write_bytes(b"x")
    for model in (str(empty), f"hf:{empty}"):
        rc, err = _eval_rc(model, tmp_path, capsys)
        assert rc == 3 and str(empty) in err and "Traceback" not in err, err
        assert "config.json" in err and "local-dir:" in err
    with pytest.raises(DataError, match=r"neither an open_clip model \(open_clip_config.json"):
        user_specs(str(empty))
    # an open_clip folder named as a transformers one, and the reverse
    (empty / "open_clip_config.json").write_text("{}")
    with pytest.raises(DataError, match=rf"it is an open_clip folder: pass --model local-dir:{empty}"):
        hardrank.load_model(hardrank.ModelSpec(f"hf:{empty}", device="cpu"))
    clip = make_clip(tmp_path / "clip")
    with pytest.raises(DataError, match=rf"a transformers model is --model hf:{clip}"):
        hardrank.load_model(hardrank.ModelSpec(f"local-dir:{clip}", device="cpu"))


def test_a_text_only_model_is_refused(tmp_path, capsys):
    bert = tmp_path / "bert"
    bert.mkdir()
    BertConfig(vocab_size=50, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=64).save_pretrained(bert)
    rc, err = _eval_rc(f"hf:{bert}", tmp_path, capsys)
    assert rc == 3 and "Traceback" not in err
    assert f"{bert} is a transformers 'bert' model (BertModel) without an image tower and a text tower" in err
    assert "CLIPModel or SiglipModel" in err


def test_a_repo_missing_from_the_cache_names_the_fetch(tmp_path, offline, capsys):
    rc, err = _eval_rc("hf:testorg/tiny-clip", tmp_path, capsys)
    assert rc == 3 and "Traceback" not in err
    assert "testorg/tiny-clip is not in the local Hugging Face cache" in err
    assert "Fetch its model files once with `hf download testorg/tiny-clip`" in err
    # the snapshot, laid out as huggingface_hub caches a download, loads offline
    commit = "0123456789abcdef0123456789abcdef01234567"
    base = offline["hub"] / "models--testorg--tiny-clip"
    (base / "refs").mkdir(parents=True)
    (base / "refs" / "main").write_text(commit)
    make_clip(base / "snapshots" / commit)
    m = hardrank.load_model(hardrank.ModelSpec("hf:testorg/tiny-clip", device="cpu"))
    assert m.info["transformers"]["folder"] == str(base / "snapshots" / commit) and m.label == "tiny-clip"
    assert m.arch_name == "hf:testorg/tiny-clip" and m.fingerprint.startswith("hf-tiny-clip-fp32-")
    assert offline["tries"] == []


def test_bad_spellings_and_options(tmp_path):
    from hardrank.embed import make_transform

    folder = make_clip(tmp_path / "model")
    with pytest.raises(UsageError, match="--pretrained applies to open_clip model names"):
        hardrank.load_model(hardrank.ModelSpec(f"hf:{folder}", pretrained="openai", device="cpu"))
    with pytest.raises(UsageError, match=r"a transformers model \(CLIPImageProcessor\) has no open_clip transform"):
        make_transform(hardrank.load_model(hardrank.ModelSpec(f"hf:{folder}", device="cpu")).preprocess_cfg)
    with pytest.raises(UsageError, match="--decoder dali: transformers"):
        hardrank_embed(hardrank.ModelSpec(f"hf:{folder}", device="cpu"), tmp_path / "s", [], ["a"], decoder="dali")
    with pytest.raises(DataError, match="checkpoint .*nope does not exist"):
        hardrank.load_model(hardrank.ModelSpec(f"hf:{folder}", str(tmp_path / "nope"), device="cpu"))
    (folder / "model.safetensors").rename(tmp_path / "w.safetensors")
    with pytest.raises(UsageError, match="holds no weights .* or --random-init"):
        hardrank.load_model(hardrank.ModelSpec(f"hf:{folder}", device="cpu"))
    siglip = make_siglip(tmp_path / "siglip")
    with pytest.raises(DataError, match="does not fit model"):
        hardrank.load_model(hardrank.ModelSpec(f"hf:{folder}", str(siglip / "model.safetensors"), device="cpu"))


def test_without_transformers_the_extra_is_named(tmp_path, monkeypatch, capsys):
    folder = make_clip(tmp_path / "model")
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(MissingExtra, match=r"needs the optional package 'transformers', which is not installed; "
                                           r"install it with: pip install 'hardrank\[hf\]'"):
        hardrank.load_model(hardrank.ModelSpec(f"hf:{folder}", device="cpu"))
    rc, err = _eval_rc(f"hf:{folder}", tmp_path, capsys)
    assert rc == 1 and "pip install 'hardrank[hf]'" in err and "Traceback" not in err


def test_perturb_texts_ranks_words_with_a_transformers_model(tmp_path):
    """`perturb texts --model hf:...` loads through the same loader: a word's influence is 1 - cos(caption,
    caption without it), with the embeddings of transformers' own path."""
    from hardrank.perturb.run import _load
    from hardrank.perturb.texts import embedding_influence

    folder = make_clip(tmp_path / "model")
    m = _load(hardrank.PerturbTextsConfig(annotations="unused.json", out=str(tmp_path / "o"), model=str(folder),
                                          device="cpu"))
    caption = "a dog on a bus"
    words = caption.split()
    variants = [caption] + [" ".join(words[:i] + words[i + 1:]) for i in range(len(words))]
    _, ref = reference(folder, [], variants)
    (got,) = embedding_influence(m.model, m.tokenizer, [caption])
    np.testing.assert_allclose(got, 1 - ref[1:] @ ref[0], atol=1e-5)


def test_siglip2_naflex_embeddings_equal_transformers_own_path(tmp_path, offline):
    """Siglip2Model: each image its own patch grid (aspect ratios differ within the batch), its patches padded
    to max_num_patches, so a batch is three fixed-shape arrays; embeddings equal its processor + model, an
    unreadable image in the batch is recorded and the others still equal; captions as Siglip2Processor pads them."""
    from transformers import AutoImageProcessor, AutoTokenizer

    from hardrank.encoding.decoders import make_decoder

    folder = make_siglip2(tmp_path / "model")
    images = photos(tmp_path / "img")
    broken = tmp_path / "img" / "broken.jpg"
    broken.write_bytes(images[0].read_bytes()[:40])
    img, txt, m = hardrank_embed(hardrank.ModelSpec(f"hf:{folder}", device="cpu"), tmp_path / "s",
                                 [*images, broken], CAPTIONS)
    ref_img, ref_txt = reference(folder, images, CAPTIONS)
    _close(img[:-1], ref_img)
    _close(txt, ref_txt)
    assert not img[-1].any() and m.info["transformers"]["class"] == "Siglip2Model"
    # the decode stage's arrays are the processor's, bit for bit, with the grids of the aspect ratios
    proc = AutoImageProcessor.from_pretrained(str(folder))
    want = proc(images=[Image.open(p) for p in images], return_tensors="pt")
    got = make_decoder(m.preprocess_cfg, threads=3)({"ref": [hardrank.ImageRef(str(p)) for p in images]})
    assert got["ok"].all() and set(got["pixels"]) == {"pixel_values", "pixel_attention_mask", "spatial_shapes"}
    for k, v in got["pixels"].items():
        assert torch.equal(v, want[k]), k
    assert got["pixels"]["pixel_values"].shape == (len(images), 16, 3 * 8 * 8)
    assert len({tuple(g) for g in got["pixels"]["spatial_shapes"].tolist()}) >= 3  # e.g. 3x5, 6x2, 4x4
    # captions: Siglip2Processor's text path (padding="max_length", truncation, ids and mask), at the table's length
    tokens = Siglip2Processor(image_processor=proc, tokenizer=AutoTokenizer.from_pretrained(str(folder)))(
        text=CAPTIONS, max_length=LENGTH, return_tensors="pt")
    mine = m.tokenizer(CAPTIONS)
    assert set(mine) == {"input_ids", "attention_mask"} and not mine["attention_mask"].all()
    assert all(torch.equal(mine[k], tokens[k]) for k in mine)
    assert offline["tries"] == []


def test_siglip2_fingerprint_holds_max_num_patches_and_the_processor(tmp_path):
    folder = make_siglip2(tmp_path / "model")
    m = hardrank.load_model(hardrank.ModelSpec(f"hf:{folder}", device="cpu"))
    assert m.preprocess_cfg["inputs"]["pixel_values"]["shape"] == [16, 192]
    cfg = image_processor_settings(folder)
    fps = {m.fingerprint}
    for change in ({"max_num_patches": 9}, {"resample": 3}, {"image_mean": [0.4, 0.5, 0.5]}):
        edit_image_processor(folder, **{**cfg, **change})
        fps.add(hardrank.load_model(hardrank.ModelSpec(f"hf:{folder}", device="cpu")).fingerprint)
    assert len(fps) == 4


def test_an_unsupported_variable_resolution_processor_is_refused(tmp_path):
    """A processor whose images vary in size, other than SigLIP 2's, is refused by name; so is a SigLIP 2
    model saved with a fixed-size processor (no max_num_patches)."""
    folder = make_clip(tmp_path / "clip")
    edit_image_processor(folder, do_center_crop=False)
    with pytest.raises(UsageError, match=r"its image processor \(CLIPImageProcessor\) gives images of varying size"
                                         r".* only SigLIP 2's \(Siglip2Model, .*\) is supported"):
        hardrank.load_model(hardrank.ModelSpec(f"hf:{folder}", device="cpu"))
    s2 = make_siglip2(tmp_path / "siglip2")
    (s2 / "processor_config.json").unlink()
    SiglipImageProcessor(size={"height": 32, "width": 32}).save_pretrained(s2)  # the wrong processor, saved alone
    with pytest.raises(UsageError, match=r"a SigLIP 2 model needs its variable-resolution image processor "
                                         r"\(Siglip2ImageProcessor, with max_num_patches and patch_size\), got "
                                         r"SiglipImageProcessor"):
        hardrank.load_model(hardrank.ModelSpec(f"hf:{s2}", device="cpu"))


def test_eval_karpathy_with_siglip2_on_the_toy_world(tmp_path, capsys):
    world = Path(build_world(tmp_path / "world", WorldConfig(n_train=0, n_test=12, n_inpaint=0)))
    folder = make_siglip2(tmp_path / "tiny-siglip2")
    rc = main(["eval", "--model", f"hf:{folder}", "--suite", "karpathy", "--annotations",
               str(world / "karpathy_test.json"), "--images", str(world / "images"), "--out", str(tmp_path / "o"),
               "--store", str(tmp_path / "s"), "--device", "cpu", "--quiet"])
    assert rc == 0, capsys.readouterr().err
    result = json.loads((tmp_path / "o" / "tiny-siglip2" / "karpathy.json").read_text())
    assert result["provenance"]["model_source"]["transformers"]["class"] == "Siglip2Model"
    assert result["model_fingerprint"].startswith("hf-tiny-siglip2-fp32-")
    assert result["counts"] and "R@1" in result["metrics"]["original"]["i2t"], result["metrics"]


def test_a_registered_family_decides_how_a_model_type_encodes(tmp_path, monkeypatch):
    """A family (BLIP's retrieval model, say) plugs in by model_type: its class and encoders are the ones used."""
    from hardrank.models import hf_models

    folder = make_clip(tmp_path / "model")
    images = photos(tmp_path / "img")[:2]
    base, _ = reference(folder, images, ["a"])
    calls = []

    def image_features(model, pixels):
        calls.append(type(model).__name__)
        return -model.get_image_features(pixel_values=pixels).pooler_output

    monkeypatch.setitem(hf_models.FAMILIES, "clip", hf_models.Family("CLIPModel", image_features=image_features))
    img, _, m = hardrank_embed(hardrank.ModelSpec(f"hf:{folder}", device="cpu"), tmp_path / "s", images, ["a"])
    _close(img, -base)
    assert calls and set(calls) == {"CLIPModel"} and m.model.family.image_features is image_features
