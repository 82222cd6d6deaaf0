"""gpu_check part about the transformers paths: a ViT-B/32-sized ``hf:`` CLIP and a BLIP-base-sized ``blip:``
model with ``--rerank itm:K``, end to end on the generated COCO-sized JPEGs.

Both models are random-init and saved as users save them (``save_pretrained`` of the model and of its processor,
a tokenizer trained here on the captions' words): nothing is downloaded, so the figures are speeds, not scores.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from gpu_check_models import _captions, _world
from gpu_check_parts import Recorder


def _tokenizer(special: list[str], bert: bool):
    """A tokenizer trained on the captions' words: byte-level BPE (CLIP's kind) or WordPiece (BERT's, for BLIP)."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    words = _captions(2000, seed=7)
    if bert:
        tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        tok.normalizer = normalizers.BertNormalizer(lowercase=True)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece()
        tok.train_from_iterator(words, trainers.WordPieceTrainer(vocab_size=400, special_tokens=special))
        tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", special_tokens=[
            ("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
        return tok, PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]",
                                            cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]",
                                            model_max_length=35)
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(words, trainers.BpeTrainer(vocab_size=400, special_tokens=special,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos, eos = tok.token_to_id(special[0]), tok.token_to_id(special[1])
    tok.post_processor = processors.TemplateProcessing(single=f"{special[0]} $A {special[1]}",
                                                       special_tokens=[(special[0], bos), (special[1], eos)])
    return tok, PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=special[0], eos_token=special[1],
                                        pad_token=special[1], model_max_length=77,
                                        model_input_names=["input_ids", "attention_mask"])


def _clip_folder(folder: Path, tiny: bool = False) -> Path:
    """transformers' default CLIPConfig (ViT-B/32 at 224, a 12-layer 512-wide text tower), random-init; ``tiny``
    (the CPU profile): the same layout at two 64-wide layers a tower, so CI's run builds it in a second."""
    import torch
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor

    if (folder / "config.json").is_file():
        return folder
    tok, fast = _tokenizer(["<|startoftext|>", "<|endoftext|>"], bert=False)
    eos = tok.token_to_id("<|endoftext|>")
    torch.manual_seed(0)
    text = {"vocab_size": tok.get_vocab_size(), "bos_token_id": tok.token_to_id("<|startoftext|>"),
            "eos_token_id": eos, "pad_token_id": eos}
    small = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 2}
    CLIPModel(CLIPConfig(text_config={**text, **small} if tiny else text, vision_config=small if tiny else None,
                         projection_dim=32 if tiny else 512)).save_pretrained(folder)
    CLIPProcessor(image_processor=CLIPImageProcessor(), tokenizer=fast).save_pretrained(folder)
    return folder


def _blip_folder(folder: Path, tiny: bool = False) -> Path:
    """transformers' default BlipConfig (ViT-B/16 at 384, a BERT-base text tower with cross-attention: BLIP base's
    retrieval shape), random-init (``tiny``: the makers' shared signature; the CPU profile skips BLIP)."""
    import torch
    from transformers import BlipConfig, BlipForImageTextRetrieval, BlipImageProcessor, BlipProcessor

    if (folder / "config.json").is_file():
        return folder
    tok, fast = _tokenizer(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "[DEC]", "[ENC]"], bert=True)
    torch.manual_seed(0)
    cfg = BlipConfig(text_config={"vocab_size": tok.get_vocab_size(), "pad_token_id": tok.token_to_id("[PAD]"),
                                  "bos_token_id": tok.token_to_id("[CLS]"), "sep_token_id": tok.token_to_id("[SEP]")})
    BlipForImageTextRetrieval(cfg).save_pretrained(folder)
    size = cfg.vision_config.image_size
    BlipProcessor(image_processor=BlipImageProcessor(size={"height": size, "width": size}),
                  tokenizer=fast).save_pretrained(folder)
    return folder


def part_e2e_hf(rec: Recorder, profile: dict, work: Path, args) -> None:
    """hardrank.evaluate with ``hf:`` CLIP (Karpathy, the e2e world) and ``blip:`` with ``--rerank itm:K`` (a
    smaller world: K cross-encoder passes per query): images/s and where the time goes."""
    import hardrank
    from hardrank.jobs.bench.timing import timed

    p, device = profile["e2e_hf"], profile["device"]
    r = rec.result
    r.update(config=dict(p))
    for name, maker, images, rerank in (("hf_clip", _clip_folder, p["clip_images"], None),
                                        ("blip_rerank", _blip_folder, p["blip_images"], f"itm:{p['rerank_k']}")):
        if p.get("tiny") and name == "blip_rerank":
            continue  # the CPU profile: BLIP base is too large for CI's seconds
        ann, root = _world(work, images, p["captions"], p["threads"])
        tiny = bool(p.get("tiny"))  # (its own folder: a GPU run after a CPU run in the same --work found the tiny one)
        build_s, folder = timed(lambda maker=maker, name=name, tiny=tiny: maker(
            work / "models" / (f"{name}-tiny" if tiny else name), tiny=tiny))
        for sub in ("store", "results"):
            shutil.rmtree(work / f"{name}_{sub}", ignore_errors=True)
        kw = {"rerank": rerank} if rerank else {}
        wall, report = timed(lambda folder=folder, kw=kw, ann=ann, root=root, name=name: hardrank.evaluate(
            model=f"{'blip' if name == 'blip_rerank' else 'hf'}:{folder}", suites=["karpathy"],
            annotations=str(ann), images=str(root), out=str(work / f"{name}_results"),
            store=str(work / f"{name}_store"), decode_threads=p["threads"], batch_size=p["batch"],
            device=device, **kw), device)
        img, txt = report.embed_stats["image"], report.embed_stats["text"]
        st = img["stage_seconds"]
        timings = {k: round(v, 3) for res in report.results
                   for k, v in res["provenance"]["timings"].items() if k.startswith(("rank_", "rerank"))}
        n_img = img["encoded"]
        r[name] = {"images": n_img, "texts": txt["encoded"], "rerank": rerank, "build_s": round(build_s, 1),
                   "wall_s": round(wall, 2),
                   "images_per_s": round(n_img / img["seconds"], 1) if img["seconds"] else None,
                   "images_per_s_wall": round(n_img / wall, 1),
                   "seconds": {"image_embed": img["seconds"], "text_embed": txt["seconds"],
                               "decode": st.get("decode"), "encode": st.get("encode"), **timings},
                   "r_at_1_i2t": [res["metrics"]["original"]["i2t"]["R@1"] for res in report.results]}
        rec.save()
