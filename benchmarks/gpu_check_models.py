"""gpu_check parts about the models: encoders against the fp16 peak, the engine end to end, DALI and Ray on the GPU."""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from gpu_check_parts import Recorder, peak_tflops, sig, write_json


def _captions(n: int, seed: int = 0) -> list[str]:
    """COCO-like captions: 8-14 words from a small vocabulary (about 12-18 tokens each)."""
    import numpy as np

    words = ("a man woman child dog cat red blue green small large wooden old young sitting standing "
             "on in near the table street field beach with holding two three people car bus train plate of "
             "food pizza bench water grass snow skateboard kite umbrella white black brown next to front "
             "bowl riding walking looking at sign tree building").split()
    rng = np.random.default_rng(seed)
    return [" ".join(rng.choice(words, int(rng.integers(8, 15)))) for _ in range(n)]


def part_encoders(rec: Recorder, profile: dict, work: Path, args) -> None:
    """open_clip image and text towers (random init; fp16 on CUDA, fp32 on CPU): the bare forward and the engine's
    encode stage (which casts, normalises and copies embeddings back), in items/s and as a fraction of peak."""
    import torch

    device = profile["device"]
    peak = peak_tflops(torch.cuda.get_device_name(0), args.peak_tflops)["fp16_dense"] if device == "cuda" else None
    rec.result.update(device=device, precision="fp16" if device == "cuda" else "fp32", peak_fp16_dense_tflops=peak,
                      rows=[])
    for arch in profile["encoder_archs"]:
        if rec.left() < 10:
            rec.result.setdefault("not_run", []).append(f"{arch}: out of time")
            continue
        _encoder_rows(rec, profile, arch, peak)
        if device == "cuda":
            torch.cuda.empty_cache()


def _encoder_rows(rec: Recorder, profile: dict, arch: str, peak: float | None) -> None:
    import open_clip
    import torch

    from hardrank import ModelSpec, load_model
    from hardrank.embed import ImageEncoder, TextEncoder, encode_text
    from hardrank.jobs.bench.timing import image_flops, text_flops, throughput

    device, min_s = profile["device"], profile["encoder_min_s"]
    m = load_model(ModelSpec(arch, None, rec.result["precision"], device, random_init=True))
    cfg = open_clip.get_model_config(arch)
    size = cfg["vision_cfg"]["image_size"]
    texts = _captions(256 if device == "cuda" else 4)

    def row(tower, what, batch, fn, flops):
        rate = throughput(fn, batch, device, min_s)
        x = {"arch": arch, "tower": tower, "what": what, "batch": batch, "items_per_s": round(rate, 1),
             "gflop_per_item": round(flops / 1e9, 3), "tflops": sig(rate * flops / 1e12)}
        x["fraction_of_peak"] = round(x["tflops"] / peak, 3) if peak else None
        rec.result["rows"].append(x)
        rec.save()
        print(f"  {arch:<9} {tower:<5} {what:<40} batch {batch:5d} {rate:10.1f}/s {x['tflops']:7.1f} TFLOP/s",
              flush=True)

    with torch.inference_mode():
        for b in profile["encoder_batches"]:
            px = torch.randn(b, 3, size, size, device=device).to(m.dtype)  # (B, 3, H, W) in the model's dtype
            row("image", "model.encode_image (pixels on device)", b, lambda: m.model.encode_image(px), image_flops(cfg))
        b = profile["encoder_batches"][0]
        stage = ImageEncoder([m])
        px32 = torch.randn(b, 3, size, size, device=device)  # float32, as decoders deliver, already on the device
        row("image", "engine ImageEncoder stage", b, lambda: stage({"pixels": px32}), image_flops(cfg))
        tok = m.tokenizer(texts).to(device)  # (n, 77)
        n_tok = int(tok.argmax(-1).max()) + 1  # the trimmed length encode_text runs at (EOT has the largest id)
        row("text", f"encode_text (trimmed to {n_tok} tokens)", len(texts), lambda: encode_text(m.model, tok),
            text_flops(cfg, n_tok))
        tstage = TextEncoder([m])
        row("text", "engine TextEncoder stage (+tokenise)", len(texts), lambda: tstage({"text": texts}),
            text_flops(cfg, n_tok))




def _world(work: Path, n_images: int, captions: int, threads: int) -> tuple[Path, Path]:
    """(Karpathy annotation file, image root) of ``n_images`` generated COCO-sized JPEGs (640x480, q90, distinct
    content) with ``captions`` captions each; made in parallel once, reused by later runs."""
    import multiprocessing as mp

    from hardrank.jobs.bench.inputs import coco_like_jpegs

    root = work / f"coco_{n_images}"
    ann = root / "karpathy_test.json"
    if ann.is_file():
        return ann, root
    chunks = max(1, min(threads, n_images // 8 or 1))
    sizes = [n_images // chunks + (c < n_images % chunks) for c in range(chunks)]
    with mp.get_context("fork").Pool(chunks) as pool:  # no CUDA in this process yet: fork is safe
        paths = pool.starmap(coco_like_jpegs, [(root / f"c{c:02d}", n, (640, 480), 1000 + c)
                                               for c, n in enumerate(sizes)])
    flat = [Path(p).relative_to(root).as_posix() for ps in paths for p in ps]
    caps = _captions(len(flat) * captions, seed=1)
    items = [{"image": p, "caption": caps[i * captions:(i + 1) * captions]} for i, p in enumerate(flat)]
    write_json(ann, items)  # written last: its presence means the world is whole
    return ann, root


def _checkpoints(work: Path, arch: str, k: int) -> tuple[str, list[str]]:
    """(model, k random-init checkpoint files): an open_clip built-in name saved as fp16 safetensors, or the
    benchmarks' tiny config."""
    if arch in ("tiny", "small"):
        from hardrank.jobs.bench.inputs import small_checkpoints

        return small_checkpoints(work / "models", k, arch)
    import open_clip
    import torch
    from safetensors.torch import save_file

    out = []
    for i in range(k):
        path = work / "models" / f"{arch}-rand{i}.safetensors"
        if not path.is_file():
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.manual_seed(i)
            model = open_clip.create_model(arch, pretrained=None)
            save_file({n: t.detach().half().contiguous() for n, t in model.state_dict().items()}, str(path) + ".tmp")
            os.replace(str(path) + ".tmp", path)
        out.append(str(path))
    return arch, out


def _h2d(batch: int, size: int) -> dict:
    """Seconds to copy one decoded batch (B, 3, H, W) float32 to the GPU: pageable (what the engine does: the
    decoders return ordinary tensors) and pinned."""
    import torch

    from hardrank.jobs.bench.timing import best_of

    x = torch.rand(batch, 3, size, size)
    out = {}
    for kind, src in (("pageable", x), ("pinned", x.pin_memory())):
        s = best_of(lambda src=src: [src.to("cuda", non_blocking=True) for _ in range(5)], "cuda", 3) / 5
        out[f"{kind}_s"] = round(s, 5)
        out[f"{kind}_gb_s"] = round(x.numel() * 4 / s / 1e9, 2)
    return out


def part_e2e(rec: Recorder, profile: dict, work: Path, args) -> None:
    """hardrank.evaluate on generated COCO-sized JPEGs (Karpathy suite: i2t and t2i), K checkpoints sharing one
    Pillow decode: images/s, and where the time goes (decode, host-to-device copy, encode, rank)."""
    import shutil

    import torch

    import hardrank
    from hardrank.jobs.bench.timing import timed

    p = profile["e2e"]
    r = rec.result
    r.update(config=dict(p))
    world_s, (ann, root) = timed(lambda: _world(work, p["images"], p["captions"], p["threads"]))
    ckpt_s, (model, ckpts) = timed(lambda: _checkpoints(work, p["arch"], p["k"]))
    r.update(world_s=round(world_s, 1), checkpoints_s=round(ckpt_s, 1))
    rec.save()
    device = profile["device"]
    for folder in ("e2e_store", "e2e_results"):  # cold store: every image is decoded and encoded
        shutil.rmtree(work / folder, ignore_errors=True)
    wall, report = timed(lambda: hardrank.evaluate(
        model=model, checkpoints=ckpts, suites=["karpathy"], annotations=str(ann), images=str(root),
        out=str(work / "e2e_results"), store=str(work / "e2e_store"), decode_threads=p["threads"],
        batch_size=p["batch"], device=device), device)
    img, txt = report.embed_stats["image"], report.embed_stats["text"]
    st = img["stage_seconds"]
    n_img, k = img["encoded"], p["k"]
    rank = sum(v for res in report.results for key, v in res["provenance"]["timings"].items()
               if key.startswith("rank_"))
    batches = math.ceil(n_img / p["batch"])
    r.update(images=n_img, texts=txt["encoded"], k=k, device=device, wall_s=round(wall, 2),
             images_per_s=round(n_img / img["seconds"], 1) if img["seconds"] else None,
             images_per_s_wall=round(n_img / wall, 1),
             image_x_checkpoint_per_s=round(n_img * k / img["seconds"], 1) if img["seconds"] else None,
             r_at_1_i2t=[res["metrics"]["original"]["i2t"]["R@1"] for res in report.results])
    h2d = _h2d(p["batch"], 224) if device == "cuda" else None
    h2d_s = h2d["pageable_s"] * batches * k if h2d else None  # ImageEncoder copies each batch once per checkpoint
    r["seconds"] = {
        "image_embed": img["seconds"], "text_embed": txt["seconds"],
        "decode": st.get("decode"),                  # in a prefetch thread: overlaps encode
        "encode": st.get("encode"),                  # K checkpoints; includes the copies to and from the GPU
        "h2d_copy_est": round(h2d_s, 3) if h2d_s is not None else None,
        "rank": round(rank, 3), "write": st.get("write"), "key": st.get("key"),
        "other": round(wall - img["seconds"] - txt["seconds"] - rank, 3),  # model loading, suite load, results
    }
    r["h2d_per_batch"] = h2d
    r["decode_images_per_s"] = round(n_img / st["decode"], 1) if st.get("decode") else None
    r["encode_images_per_s"] = round(n_img / st["encode"], 1) if st.get("encode") else None
    r["bound_by"] = None if not (st.get("decode") and st.get("encode")) else (
        "decode" if st["decode"] > st["encode"] else "encode")
    rec.save()
    if device == "cuda":
        torch.cuda.empty_cache()


# -- the optional GPU paths: only where their packages were carried ---------------------------------------------
def part_dali_mixed(rec: Recorder, profile: dict, work: Path, args) -> None:
    """DALI ``mixed`` decoding vs Pillow on 16 threads, on the generated JPEGs (decode + resize only)."""
    from hardrank import ModelSpec, load_model
    from hardrank.embed import PillowDecoder
    from hardrank.encoding.dali import DaliDecoder
    from hardrank.items import ImageRef
    from hardrank.jobs.bench.timing import timed

    p = profile["e2e"]
    ann, root = _world(work, min(p["images"], 2048), p["captions"], p["threads"])
    refs = [ImageRef(str(root / it["image"])) for it in json.loads(ann.read_text())]
    pre = load_model(ModelSpec("ViT-B-32", None, "fp32", "cpu", random_init=True)).preprocess_cfg
    batches = [refs[i:i + p["batch"]] for i in range(0, len(refs), p["batch"])]
    r, first = rec.result, {}
    for name, dec in (("dali_mixed", DaliDecoder(pre, threads=p["threads"], batch_size=p["batch"], device="gpu")),
                      ("pillow", PillowDecoder(pre, threads=p["threads"]))):
        first[name] = dec({"ref": batches[0]})["pixels"][:8]  # warm-up (DALI builds its pipeline)
        sec = timed(lambda dec=dec: [dec({"ref": b}) for b in batches], "cuda")[0]
        r[f"{name}_images_per_s"] = round(len(refs) / sec, 1)
        rec.save()
    diff = (first["dali_mixed"] - first["pillow"]).abs()  # normalised pixels of the first 8 images
    r.update(images=len(refs), pixel_mean_abs_diff=round(float(diff.mean()), 5),
             pixel_max_abs_diff=round(float(diff.max()), 4),
             speedup=round(r["dali_mixed_images_per_s"] / r["pillow_images_per_s"], 2))


def part_ray_gpu(rec: Recorder, profile: dict, work: Path, args) -> None:
    """The Ray executor (one encoder actor with num_gpus=1) end to end, as part_e2e on fewer images."""
    import shutil

    import hardrank
    from hardrank.jobs.bench.timing import timed

    p = dict(profile["e2e"], images=min(profile["e2e"]["images"], 2000))
    ann, root = _world(work, p["images"], p["captions"], p["threads"])
    model, ckpts = _checkpoints(work, p["arch"], p["k"])
    shutil.rmtree(work / "ray_store", ignore_errors=True)
    wall, report = timed(lambda: hardrank.evaluate(
        model=model, checkpoints=ckpts, suites=["karpathy"], annotations=str(ann), images=str(root),
        out=str(work / "ray_results"), store=str(work / "ray_store"), decode_threads=p["threads"],
        batch_size=p["batch"], executor="ray"), "cuda")
    img = report.embed_stats["image"]
    rec.result.update(images=img["encoded"], wall_s=round(wall, 2),
                      images_per_s=round(img["encoded"] / img["seconds"], 1) if img["seconds"] else None)

