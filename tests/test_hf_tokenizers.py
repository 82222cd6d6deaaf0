"""open_clip models whose text side is Hugging Face's (SigLIP-style tokenizers, transformers text towers), offline.

Tokenizers are trained here with the ``tokenizers`` library and saved with transformers into a
stand-in Hugging Face cache, as huggingface_hub lays out a download. What hardrank embeds must equal
open_clip's own tokenizer + model path; nothing may open a connection; what is missing is named with
the command that fetches it.
"""
from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import huggingface_hub.constants as hf_constants
import numpy as np
import open_clip
import pytest
import torch
from helpers import empty_hf_cache_no_network, make_karpathy_world
from PIL import Image
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import BertConfig, PreTrainedTokenizerFast

import hardrank
from hardrank.errors import DataError, MissingExtra
from hardrank.jobs.cli import main

PHOTO = Path(__import__("matplotlib").get_data_path()) / "sample_data" / "grace_hopper.jpg"
CAPTIONS = ["a portrait of an officer in uniform", "A Dog, and a CAT on the bus!", "zebra",
            "two men ride horses near the boat " * 6,  # longer than the context: truncated
            "pizza   on\ta table"]
SENTENCES = ["a portrait of an officer in uniform", "a dog and a cat on a bus", "a red square left of a blue circle",
             "two men ride horses near the boat", "pizza on a table", "an old photograph of a woman in a hat"]
VISION = {"image_size": 32, "layers": 1, "width": 64, "head_width": 32, "patch_size": 16}
# SigLIP's shape: open_clip's own text transformer without a causal mask, 'last' pooling, a T5-style
# tokenizer from the hub (end-of-sequence appended, padded to the context), canonicalised captions
SIGLIP_LIKE = {"embed_dim": 32, "init_logit_bias": -10, "custom_text": True, "vision_cfg": VISION,
               "text_cfg": {"context_length": 16, "vocab_size": 64, "hf_tokenizer_name": "testorg/tiny-t5tok",
                            "tokenizer_kwargs": {"clean": "canonicalize"}, "width": 32, "heads": 2, "layers": 1,
                            "no_causal_mask": True, "proj_bias": True, "pool_type": "last",
                            "norm_kwargs": {"eps": 1e-6}}}
# xlm-roberta / mt5 / NLLB's shape: a transformers text tower and its tokenizer, both named by repo
TOWER = {"embed_dim": 32, "vision_cfg": VISION,
         "text_cfg": {"hf_model_name": "testorg/tiny-bert", "hf_tokenizer_name": "testorg/tiny-bert",
                      "hf_pooler_type": "mean_pooler", "hf_proj_type": "linear"}}
ARCHS = {"hr-siglip-tiny": SIGLIP_LIKE, "hr-tower-tiny": TOWER}
pytestmark = pytest.mark.skipif(not PHOTO.is_file(), reason="matplotlib's sample photograph is not installed")


@pytest.fixture(scope="module", autouse=True)
def archs(tmp_path_factory):
    root = tmp_path_factory.mktemp("archs")
    for name, cfg in ARCHS.items():
        (root / f"{name}.json").write_text(json.dumps(cfg))
        open_clip.add_model_config(root / f"{name}.json")
    return root


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache, and a network that refuses (and counts) every connection: hardrank
    must not need HF_HUB_OFFLINE to stay offline."""
    return empty_hf_cache_no_network(tmp_path / "hub", monkeypatch)


def _snapshot(hub: Path, repo: str) -> Path:
    """An empty snapshot folder laid out as huggingface_hub caches a download: refs/main -> snapshots/<commit>/."""
    base = hub / f"models--{repo.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    (base / "refs").mkdir(parents=True, exist_ok=True)
    (base / "refs" / "main").write_text(commit)
    (base / "snapshots" / commit).mkdir(parents=True, exist_ok=True)
    return base / "snapshots" / commit


def _t5_tokenizer(folder: Path, sentences=SENTENCES) -> None:
    """A T5-like Unigram tokenizer (pad 0, eos 1, eos appended), saved as transformers saves one, beside
    a config.json as timm's SigLIP repos hold (transformers' AutoTokenizer reads one from a repo)."""
    (folder / "config.json").write_text(json.dumps({"architecture": "hr-siglip-tiny"}))
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(sentences, trainers.UnigramTrainer(vocab_size=60, special_tokens=["<pad>", "</s>", "<unk>"],
                                                               unk_token="<unk>"))
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>",
                            unk_token="<unk>").save_pretrained(folder)


def _bert_tokenizer(folder: Path) -> int:
    """A BERT-like WordPiece tokenizer ([CLS] ... [SEP]) and a tiny BERT config; returns the vocabulary size."""
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(SENTENCES, trainers.WordPieceTrainer(
        vocab_size=80, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[
        ("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                            sep_token="[SEP]", mask_token="[MASK]").save_pretrained(folder)
    BertConfig(vocab_size=tok.get_vocab_size(), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
               intermediate_size=64, max_position_embeddings=80).save_pretrained(folder)
    return tok.get_vocab_size()


def _hub_files(hub: Path, name: str) -> Path:
    """The Hugging Face files model ``name`` names, in the cache."""
    if name == "hr-siglip-tiny":
        folder = _snapshot(hub, "testorg/tiny-t5tok")
        _t5_tokenizer(folder)
    else:
        folder = _snapshot(hub, "testorg/tiny-bert")
        _bert_tokenizer(folder)
    return folder


def _checkpoint(name: str, path: Path, monkeypatch, seed: int = 0) -> Path:
    """Random weights of ``name``, built by open_clip itself (offline: from the cache)."""
    with monkeypatch.context() as m:
        m.setattr(hf_constants, "HF_HUB_OFFLINE", True)
        torch.manual_seed(seed)
        model = open_clip.create_model(name, pretrained=None, pretrained_text=False)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def _hardrank(spec: hardrank.ModelSpec, store: Path):
    pipe = hardrank.EmbedPipeline([spec], hardrank.EmbedOptions(store=str(store), device="cpu"))
    tables = hardrank.Tables.empty()
    tables.images.add(hardrank.ImageRef(str(PHOTO)))
    for c in CAPTIONS:
        tables.texts.add(c)
    pipe.run(tables)
    emb = pipe.embeddings(0, tables, np.float32)
    return emb["image"], emb["text"], pipe.models[0]


def _open_clip(name: str, ckpt: str | None, monkeypatch):
    """open_clip's own path: create_model_and_transforms + get_tokenizer (offline: HF_HUB_OFFLINE)."""
    with monkeypatch.context() as m:
        m.setattr(hf_constants, "HF_HUB_OFFLINE", True)
        model, _, preprocess = open_clip.create_model_and_transforms(name, pretrained=ckpt)
        tokenizer = open_clip.get_tokenizer(name)
    model.eval()
    with torch.no_grad():
        img = model.encode_image(preprocess(Image.open(PHOTO).convert("RGB"))[None]).float()
        txt = model.encode_text(tokenizer(CAPTIONS)).float()
    n = torch.nn.functional.normalize
    return n(img, dim=-1).numpy(), n(txt, dim=-1).numpy(), tokenizer


def _same(a, b):
    assert a.shape == b.shape and float(np.abs(a - b).max()) < 2e-5, float(np.abs(a - b).max())


@pytest.mark.parametrize("name", list(ARCHS))
def test_hf_tokenizer_models_equal_open_clip_offline(name, cache, tmp_path, monkeypatch):
    """A name whose config names a Hugging Face tokenizer (and tower): texts and a real photograph
    embed as open_clip's own tokenizer + model give them, from the cache, with no connection tried."""
    _hub_files(cache["hub"], name)
    ckpt = _checkpoint(name, tmp_path / "w.safetensors", monkeypatch)
    img, txt, m = _hardrank(hardrank.ModelSpec(name, str(ckpt), device="cpu"), tmp_path / "store")
    assert cache["tries"] == []
    ref_img, ref_txt, ref_tok = _open_clip(name, str(ckpt), monkeypatch)
    assert torch.equal(m.tokenizer(CAPTIONS), ref_tok(CAPTIONS))
    _same(img, ref_img)
    _same(txt, ref_txt)
    repo = SIGLIP_LIKE["text_cfg"]["hf_tokenizer_name"] if name == "hr-siglip-tiny" else "testorg/tiny-bert"
    assert m.info["hf"]["tokenizer"]["name"] == repo and m.info["hf"]["tokenizer"]["folder"].startswith(
        str(cache["hub"]))
    assert ("text_tower" in m.info["hf"]) == (name == "hr-tower-tiny")


def test_hf_hub_snapshot_and_local_dir_bring_their_own_tokenizer(cache, tmp_path, monkeypatch):
    """hf-hub:ORG/NAME: the tokenizer files of the snapshot the weights come from (open_clip's
    push_to_hf_hub saves them there); local-dir:FOLDER: the folder's. Nothing else need be cached."""
    build = _snapshot(tmp_path / "build", "testorg/tiny-t5tok")
    _t5_tokenizer(build)
    with monkeypatch.context() as m:
        m.setattr(hf_constants, "HF_HUB_CACHE", str(tmp_path / "build"))
        ckpt = _checkpoint("hr-siglip-tiny", tmp_path / "w.safetensors", monkeypatch)
    snap = _snapshot(cache["hub"], "testorg/tiny-siglip-hub")
    _t5_tokenizer(snap)
    cfg = {**SIGLIP_LIKE, "text_cfg": {**SIGLIP_LIKE["text_cfg"], "hf_tokenizer_name": "testorg/tiny-siglip-hub"}}
    pp = {"mean": [0.5] * 3, "std": [0.5] * 3, "interpolation": "bicubic", "resize_mode": "squash"}
    (snap / "open_clip_config.json").write_text(json.dumps({"model_cfg": cfg, "preprocess_cfg": pp}))
    (snap / "open_clip_model.safetensors").write_bytes(ckpt.read_bytes())
    ref_img, ref_txt, _ = _open_clip("hf-hub:testorg/tiny-siglip-hub", None, monkeypatch)
    for i, arch in enumerate(["hf-hub:testorg/tiny-siglip-hub", f"local-dir:{snap}"]):
        img, txt, m = _hardrank(hardrank.ModelSpec(arch, device="cpu"), tmp_path / f"store{i}")
        _same(img, ref_img)
        _same(txt, ref_txt)
        assert m.info["hf"]["tokenizer"]["folder"] == str(snap)
    assert cache["tries"] == []


def test_the_tokenizer_is_part_of_the_fingerprint(cache, tmp_path, monkeypatch):
    """Same weights, another tokenizer (or tower config) under the same name: another store folder."""
    folder = _hub_files(cache["hub"], "hr-siglip-tiny")
    ckpt = _checkpoint("hr-siglip-tiny", tmp_path / "w.safetensors", monkeypatch)
    spec = hardrank.ModelSpec("hr-siglip-tiny", str(ckpt), device="cpu")
    first = hardrank.load_model(spec).fingerprint
    assert hardrank.load_model(spec).fingerprint == first
    for p in folder.iterdir():
        p.unlink()
    _t5_tokenizer(folder, sentences=SENTENCES[::-1] + ["a zebra"])
    assert hardrank.load_model(spec).fingerprint != first
    bert = _hub_files(cache["hub"], "hr-tower-tiny")
    spec = hardrank.ModelSpec("hr-tower-tiny", random_init=True, device="cpu")
    first = hardrank.load_model(spec).fingerprint
    cfg = json.loads((bert / "config.json").read_text())
    (bert / "config.json").write_text(json.dumps({**cfg, "layer_norm_eps": 1e-6}))
    assert hardrank.load_model(spec).fingerprint != first


def test_a_missing_tokenizer_names_the_repo_and_the_fetch(cache, tmp_path, monkeypatch, capsys):
    """Nothing in the cache: exit 3 naming the repo and `hf download` of its small files, before the
    model is built, without trying the network (HF_HUB_OFFLINE is not set)."""
    ckpt = tmp_path / "w.safetensors"
    build = tmp_path / "build"
    _hub_files(build, "hr-siglip-tiny")
    with monkeypatch.context() as m:
        m.setattr(hf_constants, "HF_HUB_CACHE", str(build))
        _checkpoint("hr-siglip-tiny", ckpt, monkeypatch)
    fetch = r'`hf download testorg/tiny-t5tok --include "\*.json" --include "\*.model" --include "\*.txt"`'
    with pytest.raises(DataError, match=r"model hr-siglip-tiny: testorg/tiny-t5tok is not in the local Hugging "
                                        rf"Face cache \({cache['hub']}; LocalEntryNotFoundError\); hardrank never "
                                        r"downloads. Fetch its tokenizer files once with " + fetch):
        hardrank.load_model(hardrank.ModelSpec("hr-siglip-tiny", str(ckpt), device="cpu"))
    w = make_karpathy_world(tmp_path / "w", n_images=2)
    rc = main(["eval", "--model", "hr-siglip-tiny", "--checkpoint", str(ckpt), "--suite", "karpathy",
               "--annotations", str(w["annotations"]), "--images", str(w["images"]), "--out", str(tmp_path / "o"),
               "--store", str(tmp_path / "s"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 3 and "hf download testorg/tiny-t5tok --include" in err and "Traceback" not in err
    # a snapshot of the repo without its tokenizer files (only weights were fetched)
    snap = _snapshot(cache["hub"], "testorg/tiny-t5tok")
    (snap / "model.safetensors").write_bytes(b"")
    with pytest.raises(DataError, match=rf"{snap} holds no tokenizer files of testorg/tiny-t5tok; fetch them once "
                                        rf"with {fetch}"):
        hardrank.load_model(hardrank.ModelSpec("hr-siglip-tiny", str(ckpt), device="cpu"))
    # tokenizer files cut short (an interrupted copy)
    _t5_tokenizer(snap)
    (snap / "tokenizer.json").write_text((snap / "tokenizer.json").read_text()[:100])
    with pytest.raises(DataError, match=rf"the tokenizer files in {snap} do not load \(JSONDecodeError: .*\); fetch "
                                        rf"them again with {fetch}"):
        hardrank.load_model(hardrank.ModelSpec("hr-siglip-tiny", str(ckpt), device="cpu"))
    # a transformers tower whose config.json is not cached
    bert = _snapshot(cache["hub"], "testorg/tiny-bert")
    _bert_tokenizer(bert)
    (bert / "config.json").unlink()
    with pytest.raises(DataError, match=r"holds no config.json of testorg/tiny-bert; fetch them once with `hf download "
                                        r"testorg/tiny-bert"):
        hardrank.load_model(hardrank.ModelSpec("hr-tower-tiny", random_init=True, device="cpu"))
    assert cache["tries"] == []


def test_a_siglip_name_without_a_tokenizer_name_is_refused(cache, tmp_path):
    """open_clip would fetch a SentencePiece vocabulary from storage.googleapis.com for it."""
    cfg = {**SIGLIP_LIKE, "text_cfg": {k: v for k, v in SIGLIP_LIKE["text_cfg"].items() if k != "hf_tokenizer_name"}}
    path = tmp_path / "my-siglip.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(DataError, match=r"model .*my-siglip.json: open_clip tokenizes a model named '\*siglip\*' "
                                        r"without text_cfg.hf_tokenizer_name .* hardrank never downloads"):
        hardrank.load_model(hardrank.ModelSpec(str(path), random_init=True, device="cpu"))
    assert cache["tries"] == []


@pytest.mark.parametrize("name", list(ARCHS))
def test_without_transformers_the_extra_is_named(name, cache, tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "transformers", None)
    with pytest.raises(MissingExtra, match=r"model .* needs the optional package 'transformers', which is not "
                                           r"installed; install it with: pip install 'hardrank\[hf\]'"):
        hardrank.load_model(hardrank.ModelSpec(name, random_init=True, device="cpu"))
    w = make_karpathy_world(tmp_path / "w", n_images=2)
    rc = main(["eval", "--model", name, "--random-init", "--suite", "karpathy", "--annotations",
               str(w["annotations"]), "--images", str(w["images"]), "--out", str(tmp_path / "o"), "--store",
               str(tmp_path / "s"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 1 and "pip install 'hardrank[hf]'" in err and "Traceback" not in err


def test_a_sentencepiece_only_tokenizer_without_sentencepiece_names_the_extra(cache, monkeypatch):
    """mt5's repos hold spiece.model and no tokenizer.json: transformers needs sentencepiece to read it
    (and, without it, fails naming tiktoken)."""
    folder = _snapshot(cache["hub"], "testorg/tiny-t5tok")
    (folder / "spiece.model").write_bytes(b"a SentencePiece model")
    (folder / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "T5Tokenizer"}))
    monkeypatch.setitem(sys.modules, "sentencepiece", None)
    with pytest.raises(MissingExtra, match=r"holds a SentencePiece model, no tokenizer.json\) needs the optional "
                                           r"package 'sentencepiece', .* pip install 'hardrank\[hf\]'"):
        hardrank.load_model(hardrank.ModelSpec("hr-siglip-tiny", random_init=True, device="cpu"))


def test_models_sharing_tokenizer_files_keep_their_own_caption_cleaning(cache, tmp_path, monkeypatch):
    """Texts are tokenised once per distinct tokenizer: one folder with two open_clip cleanings
    (canonicalize, whitespace) is two tokenizers."""
    _hub_files(cache["hub"], "hr-siglip-tiny")
    ws = {**SIGLIP_LIKE, "text_cfg": {**SIGLIP_LIKE["text_cfg"], "tokenizer_kwargs": {"clean": "whitespace"}}}
    (tmp_path / "hr-siglip-tiny-ws.json").write_text(json.dumps(ws))
    open_clip.add_model_config(tmp_path / "hr-siglip-tiny-ws.json")
    ckpt = _checkpoint("hr-siglip-tiny", tmp_path / "w.safetensors", monkeypatch)
    pipe = hardrank.EmbedPipeline([hardrank.ModelSpec(n, str(ckpt), device="cpu")
                                   for n in ("hr-siglip-tiny", "hr-siglip-tiny-ws")],
                                  hardrank.EmbedOptions(store=str(tmp_path / "s"), device="cpu"))
    tables = hardrank.Tables.empty()
    for c in CAPTIONS:
        tables.texts.add(c)
    pipe.run(tables)
    for i, name in enumerate(("hr-siglip-tiny", "hr-siglip-tiny-ws")):
        _same(pipe.embeddings(i, tables, np.float32)["text"], _open_clip(name, str(ckpt), monkeypatch)[1])
    assert cache["tries"] == []


@pytest.mark.parametrize("name", list(ARCHS))
def test_eval_with_a_checkpoint_says_nothing_of_random_weights(name, cache, tmp_path, monkeypatch, capsys, caplog):
    """open_clip logs "No pretrained weights loaded ... initialized randomly" (or, for a transformers
    tower, "initialized partially") when it builds the model; the checkpoint is loaded right after."""
    _hub_files(cache["hub"], name)
    ckpt = _checkpoint(name, tmp_path / "w.safetensors", monkeypatch)
    capsys.readouterr()
    caplog.clear()  # open_clip said it of the test's own random model above
    caplog.set_level(logging.INFO)
    w = make_karpathy_world(tmp_path / "w", n_images=3)
    rc = main(["eval", "--model", name, "--checkpoint", str(ckpt), "--suite", "karpathy", "--annotations",
               str(w["annotations"]), "--images", str(w["images"]), "--out", str(tmp_path / "o"), "--store",
               str(tmp_path / "s"), "--quiet"])
    err = capsys.readouterr().err
    assert rc == 0, err
    assert "initialized" not in err and "initialized" not in caplog.text
    assert "pretrained weights" not in err.lower() + caplog.text.lower()
    (result,) = (tmp_path / "o").rglob("*.json")
    assert json.loads(result.read_text())["provenance"]["model_source"]["hf"]["tokenizer"]["name"] in (
        "testorg/tiny-t5tok", "testorg/tiny-bert")
    assert cache["tries"] == []
