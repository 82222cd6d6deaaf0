"""transformers models through the engine (``--model hf:FOLDER``) vs their own processor + model loop, same images.

The model is a random CLIPModel of ViT-B/32's input shape (224 px, patch 32, shortest-edge bicubic resize +
center crop, 77-token captions) but narrow, saved with its CLIPImageProcessor and a locally trained BPE
tokenizer. Both sides see the same COCO-sized JPEGs and captions:

  own loop   what a transformers user writes: per batch, ``[Image.open(p) ...]``, ``processor(images=...)``,
             ``model.get_image_features(**inputs)``; ``tokenizer(texts, padding="max_length")`` +
             ``get_text_features``; one thread of Python, torch's intra-op threads
  hardrank   ``embed_tables`` into a fresh store: decode + processor in the decode threads, encode, Arrow write

Rounds are interleaved (each method once per round, best of the rounds), and the embeddings of both are
compared (max |difference|, after L2 normalisation). Prints one table and writes JSON.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import tempfile
from pathlib import Path


def _model(folder: Path, width: int, layers: int) -> Path:
    """A narrow ViT-B/32-shaped CLIPModel + processor + BPE tokenizer in ``folder`` (reused if present)."""
    if (folder / "model.safetensors").is_file():
        return folder
    import torch
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, PreTrainedTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    words = [f"a photo of a {c} {o} on a {p}" for c in ("red", "blue", "green", "old", "small")
             for o in ("dog", "cat", "car", "man", "woman", "boat") for p in ("street", "table", "beach", "bus")]
    tok.train_from_iterator(words, trainers.BpeTrainer(vocab_size=500, special_tokens=[
        "<|startoftext|>", "<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    bos, eos = tok.token_to_id("<|startoftext|>"), tok.token_to_id("<|endoftext|>")
    tok.post_processor = processors.TemplateProcessing(
        single="<|startoftext|> $A <|endoftext|>", special_tokens=[("<|startoftext|>", bos), ("<|endoftext|>", eos)])
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|startoftext|>", eos_token="<|endoftext|>",
                            pad_token="<|endoftext|>", model_max_length=77,
                            model_input_names=["input_ids", "attention_mask"]).save_pretrained(folder)
    arch = {"hidden_size": width, "intermediate_size": 4 * width, "num_hidden_layers": layers,
            "num_attention_heads": max(1, width // 64)}
    torch.manual_seed(0)
    CLIPModel(CLIPConfig(text_config={**arch, "vocab_size": tok.get_vocab_size(), "max_position_embeddings": 77,
                                      "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": eos},
                         vision_config={**arch, "image_size": 224, "patch_size": 32},
                         projection_dim=width)).save_pretrained(folder)
    CLIPImageProcessor().save_pretrained(folder)  # CLIP's: shortest edge 224 bicubic, crop 224, OpenAI mean/std
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--images", type=int, default=128)
    ap.add_argument("--texts", type=int, default=512)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--data", default=os.path.join(tempfile.gettempdir(), "hardrank-bench-coco"))
    ap.add_argument("--json", default="benchmarks/results/bench_hf_models.json")
    args = ap.parse_args()
    import numpy as np
    import torch
    from PIL import Image
    from transformers import AutoImageProcessor, AutoModel, AutoTokenizer

    from hardrank.embed import embed_tables
    from hardrank.items import ImageRef, Tables
    from hardrank.jobs.bench.inputs import coco_like_jpegs
    from hardrank.jobs.bench.timing import interleaved
    from hardrank.models.load import load_model
    from hardrank.models.spec import ModelSpec
    from hardrank.store.embedding_store import EmbeddingStore

    work = Path(tempfile.mkdtemp(prefix="bench-hf-"))
    folder = _model(Path(args.data) / f"hf-clip-w{args.width}-l{args.layers}", args.width, args.layers)
    paths = coco_like_jpegs(Path(args.data) / "jpeg640", args.images)
    rng = np.random.default_rng(0)
    nouns = ["dog", "cat", "car", "man", "woman", "boat", "pizza", "table", "street", "beach"]
    texts = [" ".join(rng.choice(nouns, int(rng.integers(3, 14)))) + f" {i}" for i in range(args.texts)]
    dev = args.device
    threads = os.cpu_count() or 1

    model = AutoModel.from_pretrained(str(folder)).eval().to(dev)
    proc, tok = AutoImageProcessor.from_pretrained(str(folder)), AutoTokenizer.from_pretrained(str(folder))
    own: dict[str, list] = {}

    @torch.inference_mode()
    def own_images():
        out = []
        for s in range(0, len(paths), args.batch):
            inputs = proc(images=[Image.open(p) for p in paths[s:s + args.batch]], return_tensors="pt").to(dev)
            out.append(torch.nn.functional.normalize(model.get_image_features(**inputs).pooler_output, dim=-1))
        own["image"] = torch.cat(out).cpu().numpy()

    @torch.inference_mode()
    def own_texts():
        out = []
        for s in range(0, len(texts), args.batch):
            inputs = tok(texts[s:s + args.batch], padding="max_length", max_length=77, truncation=True,
                         return_tensors="pt").to(dev)
            out.append(torch.nn.functional.normalize(model.get_text_features(**inputs).pooler_output, dim=-1))
        own["text"] = torch.cat(out).cpu().numpy()

    m = load_model(ModelSpec(f"hf:{folder}", precision="fp32", device=dev))
    runs = [0]
    got: dict = {}
    stages: dict = {}

    def engine(modality: str):
        def run():
            tables = Tables.empty()
            if modality == "image":
                tables.images.add_many(ImageRef(p) for p in paths)
                tables.images.keys()  # content hashing is the store's, not the encoder's: outside the timing
            else:
                for t in texts:
                    tables.texts.add(t)
            runs[0] += 1
            store = EmbeddingStore(work / f"s{runs[0]}", m.fingerprint, dim=m.embed_dim, dtype=m.store_dtype)
            st = embed_tables(tables, [m], [store], batch_size=args.batch, decode_threads=threads)
            stages[modality] = st[modality].stage_seconds
            keys = tables.of(modality).keys()
            got[modality] = store.read(modality, keys)
        return run

    times = interleaved({"own images": own_images, "hardrank images": engine("image"),
                         "own texts": own_texts, "hardrank texts": engine("text")}, dev, rounds=args.rounds)
    best = {k: min(v) for k, v in times.items()}
    rows = []
    for modality, n in (("image", len(paths)), ("text", len(texts))):
        o, h = best[f"own {modality}s"], best[f"hardrank {modality}s"]
        rows.append({"modality": modality, "items": n, "own_s": round(o, 3), "hardrank_s": round(h, 3),
                     "own_per_s": round(n / o, 1), "hardrank_per_s": round(n / h, 1), "speedup": round(o / h, 2)})
    print(f"{len(paths)} JPEGs 640x480 + {len(texts)} captions; CLIPModel width {args.width}, {args.layers} layers, "
          f"224 px / 77 tokens, fp32 on {dev}; {threads} decode threads, torch {torch.get_num_threads()} threads; "
          f"best of {args.rounds} interleaved rounds; load average {os.getloadavg()[0]:.1f}")
    print(f"{'modality':9s} {'own loop s':>10s} {'hardrank s':>10s} {'own /s':>8s} {'hardrank /s':>11s} {'x':>6s}")
    for r in rows:
        print(f"{r['modality']:9s} {r['own_s']:10.3f} {r['hardrank_s']:10.3f} {r['own_per_s']:8.1f} "
              f"{r['hardrank_per_s']:11.1f} {r['speedup']:6.2f}")
    diffs = {}
    for modality in ("image", "text"):
        if got.get(modality) is not None:
            diffs[modality] = float(np.abs(np.asarray(got[modality], np.float32) - own[modality]).max())
    print(f"max |hardrank - own| after normalisation: {diffs}; hardrank stages: "
          f"{ {k: {s: round(v, 3) for s, v in d.items()} for k, d in stages.items()} }")
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"rows": rows, "max_abs_diff": diffs, "stages": stages, "args": vars(args),
                               "machine": {"cpus": os.cpu_count(), "platform": platform.platform(),
                                           "load": os.getloadavg()[0], "torch": torch.__version__}}, indent=1))
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
