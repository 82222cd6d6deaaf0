"""Tiny transformers models saved as users save them (model + processor, transformers 5's layout or 4's)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import (
    CLIPConfig,
    CLIPImageProcessor,
    CLIPModel,
    CLIPProcessor,
    PreTrainedTokenizerFast,
    Siglip2Config,
    Siglip2ImageProcessor,
    Siglip2Model,
    Siglip2Processor,
    SiglipConfig,
    SiglipImageProcessor,
    SiglipModel,
    SiglipProcessor,
)

LAYOUTS = ("5", "4")


def save_processor(folder: Path, processor, layout: str = "5") -> None:
    """``processor`` (a CLIPProcessor, BlipProcessor, ... holding an image processor and a tokenizer) saved into
    ``folder``. Layout "5": the installed transformers' ``processor.save_pretrained``: one ``processor_config.json``
    with the image processor's settings nested, and the tokenizer's files. Layout "4": what transformers 4's
    ``ProcessorMixin.save_pretrained`` wrote, each part saved by its own ``save_pretrained`` (the image
    processor's ``preprocessor_config.json`` and the tokenizer's files, no ``processor_config.json`` for
    processors without settings of their own, as CLIP's, SigLIP's and BLIP's); transformers 5's
    ``save_pretrained`` has no option to write that layout, and its parts' ``save_pretrained`` still do."""
    if layout == "5":
        processor.save_pretrained(folder)
    elif layout == "4":
        processor.image_processor.save_pretrained(folder)
        processor.tokenizer.save_pretrained(folder)
    else:
        raise ValueError(f"layout {layout!r}: one of {LAYOUTS}")


def processor_file(folder: Path) -> Path:
    """Where ``folder`` keeps its image processor's settings."""
    old = folder / "preprocessor_config.json"
    return old if old.is_file() else folder / "processor_config.json"


def image_processor_settings(folder: Path) -> dict:
    data = json.loads(processor_file(folder).read_text())
    return data if processor_file(folder).name == "preprocessor_config.json" else data["image_processor"]


def edit_image_processor(folder: Path, **changes) -> None:
    """Change the image processor's saved settings in whichever file holds them (a user editing the file)."""
    path = processor_file(folder)
    data = json.loads(path.read_text())
    if path.name == "preprocessor_config.json":
        data.update(changes)
    else:
        data["image_processor"].update(changes)
    path.write_text(json.dumps(data, indent=2))


SENTENCES = ["a portrait of an officer in uniform", "a dog and a cat on a bus", "a red square left of a blue circle",
             "two men ride horses near the boat", "pizza on a table", "an old photograph of a woman in a hat",
             "a small green triangle", "a big yellow circle"]
VISION = {"image_size": 32, "patch_size": 8, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
          "num_attention_heads": 2}
LENGTH = 16  # the text towers' position table: captions are padded and cut to it


def _bpe_tokenizer() -> tuple[PreTrainedTokenizerFast, dict]:
    """A CLIP-like byte-level BPE tokenizer (<|startoftext|> ... <|endoftext|>, padded with <|endoftext|>) and the
    ids the text config needs."""
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(SENTENCES, trainers.BpeTrainer(vocab_size=300, special_tokens=[
        "<|startoftext|>", "<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos, eos = tok.token_to_id("<|startoftext|>"), tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|startoftext|> $A <|endoftext|>", special_tokens=[("<|startoftext|>", bos), ("<|endoftext|>", eos)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|startoftext|>", eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>", model_max_length=LENGTH,
                                   model_input_names=["input_ids", "attention_mask"])
    return fast, {"vocab_size": tok.get_vocab_size(), "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": eos}


def _unigram_tokenizer() -> tuple[PreTrainedTokenizerFast, dict]:
    """A SigLIP-like (T5-style) Unigram tokenizer: pad 0, eos 1 appended, padded to the max length."""
    tok = Tokenizer(models.Unigram())
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    tok.decoder = decoders.Metaspace()
    tok.train_from_iterator(SENTENCES, trainers.UnigramTrainer(vocab_size=60, special_tokens=["<pad>", "</s>", "<unk>"],
                                                               unk_token="<unk>"))
    tok.post_processor = processors.TemplateProcessing(single="$A </s>", special_tokens=[("</s>", 1)])
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="</s>", unk_token="<unk>",
                                   model_max_length=LENGTH, model_input_names=["input_ids", "attention_mask"]
                                   )  # with a mask, as transformers 5's SiglipTokenizer
    return fast, {"vocab_size": tok.get_vocab_size(), "pad_token_id": 0, "eos_token_id": 1}


def make_clip(folder: Path, seed: int = 0, crop: int = 32, layout: str = "5", **save) -> Path:
    """A tiny random CLIPModel with its processor (shortest-edge bicubic resize + center crop) and tokenizer, saved
    as users save them: ``model.save_pretrained(folder, **save)`` + ``CLIPProcessor.save_pretrained(folder)`` in
    transformers ``layout`` 5 or 4 (``hf_helpers.save_processor``)."""
    folder.mkdir(parents=True, exist_ok=True)
    model, processor = clip_objects(seed, crop)
    model.save_pretrained(folder, **save)
    save_processor(folder, processor, layout)
    return folder


def clip_objects(seed: int = 0, crop: int = 32) -> tuple[CLIPModel, CLIPProcessor]:
    """The tiny random CLIPModel of ``make_clip`` and its CLIPProcessor, in memory (nothing saved)."""
    tok, ids = _bpe_tokenizer()
    text = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
            "max_position_embeddings": LENGTH, **ids}
    torch.manual_seed(seed)
    model = CLIPModel(CLIPConfig(text_config=text, vision_config={**VISION, "image_size": crop}, projection_dim=16))
    image = CLIPImageProcessor(size={"shortest_edge": crop}, crop_size={"height": crop, "width": crop})
    return model, CLIPProcessor(image_processor=image, tokenizer=tok)


def make_siglip(folder: Path, seed: int = 0, layout: str = "5") -> Path:
    """A tiny random SiglipModel with its processor (squash to 32 x 32, mean = std = 0.5) and tokenizer."""
    folder.mkdir(parents=True, exist_ok=True)
    tok, ids = _unigram_tokenizer()
    text = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
            "max_position_embeddings": LENGTH, **ids}
    torch.manual_seed(seed)
    SiglipModel(SiglipConfig(text_config=text, vision_config=VISION)).save_pretrained(folder)
    save_processor(folder, SiglipProcessor(image_processor=SiglipImageProcessor(size={"height": 32, "width": 32}),
                                           tokenizer=tok), layout)
    return folder


def make_siglip2(folder: Path, seed: int = 0, max_num_patches: int = 16, layout: str = "5") -> Path:
    """A tiny random Siglip2Model (NaFlex) with its processor: each image resized, aspect kept, to at most
    ``max_num_patches`` 8 x 8 patches, padded to that many; captions padded to the position table, with a mask."""
    folder.mkdir(parents=True, exist_ok=True)
    tok, ids = _unigram_tokenizer()
    text = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 2,
            "max_position_embeddings": LENGTH, **ids}
    vision = {k: v for k, v in VISION.items() if k != "image_size"}
    torch.manual_seed(seed)
    Siglip2Model(Siglip2Config(text_config=text, vision_config={**vision, "num_patches": 16})).save_pretrained(folder)
    # do_convert_rgb: the photos come in L, RGBA, P and CMYK too (without it the processor refuses them)
    image = Siglip2ImageProcessor(patch_size=8, max_num_patches=max_num_patches, do_convert_rgb=True)
    save_processor(folder, Siglip2Processor(image_processor=image, tokenizer=tok), layout)
    return folder


# an open_clip model whose text side is Hugging Face's (SigLIP's shape: a T5-style tokenizer, canonicalised captions)
OPEN_CLIP_CFG = {"embed_dim": 32, "init_logit_bias": -10, "custom_text": True,
                 "vision_cfg": {"image_size": 32, "layers": 1, "width": 64, "head_width": 32, "patch_size": 16},
                 "text_cfg": {"context_length": 16, "vocab_size": 64, "hf_tokenizer_name": "testorg/tiny-oc",
                              "tokenizer_kwargs": {"clean": "canonicalize"}, "width": 32, "heads": 2, "layers": 1,
                              "no_causal_mask": True, "proj_bias": True, "pool_type": "last",
                              "norm_kwargs": {"eps": 1e-6}}}
OPEN_CLIP_PREPROCESS = {"mean": [0.5] * 3, "std": [0.5] * 3, "interpolation": "bicubic", "resize_mode": "squash"}


def make_open_clip(folder: Path, seed: int = 0) -> Path:
    """A tiny open_clip model folder as open_clip's ``push_to_hf_hub`` lays one out: ``open_clip_config.json``
    (model_cfg + preprocess_cfg), ``open_clip_model.safetensors`` (open_clip's own random weights) and the
    tokenizer's files (``tokenizer.save_pretrained``); ``--model local-dir:FOLDER``."""
    import open_clip
    from safetensors.torch import save_file

    folder.mkdir(parents=True, exist_ok=True)
    tok, _ = _unigram_tokenizer()
    tok.save_pretrained(folder)
    (folder / "open_clip_config.json").write_text(json.dumps({"model_cfg": OPEN_CLIP_CFG,
                                                              "preprocess_cfg": OPEN_CLIP_PREPROCESS}, indent=2))
    torch.manual_seed(seed)
    model = open_clip.create_model(f"local-dir:{folder}", load_weights=False)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "open_clip_model.safetensors"))
    return folder


def publish(folder: Path, hub: Path, repo: str) -> Path:
    """``folder``'s files laid out as huggingface_hub caches a download of ``repo`` under ``hub``: each file's bytes in
    ``blobs/<sha256>``, ``snapshots/<commit>/<name>`` a relative link to it, ``refs/main`` naming the commit (a link
    already in ``folder`` is kept as it points). Returns the snapshot folder."""
    import hashlib
    import os

    base = hub / f"models--{repo.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snap = base / "snapshots" / commit
    (base / "blobs").mkdir(parents=True, exist_ok=True)
    snap.mkdir(parents=True, exist_ok=True)
    (base / "refs").mkdir(exist_ok=True)
    (base / "refs" / "main").write_text(commit)
    for p in sorted(folder.rglob("*")):
        rel = p.relative_to(folder)
        target = snap / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        if p.is_symlink():
            target.symlink_to(os.path.realpath(p))
        elif p.is_file():
            data = p.read_bytes()
            blob = base / "blobs" / hashlib.sha256(data).hexdigest()
            blob.write_bytes(data)
            target.symlink_to(os.path.relpath(blob, target.parent))
    return snap
