"""Encoders on CPU in bf16 against fp32: embedding difference on real photographs, throughput, and the
fraction of the bf16 (and fp32) GEMM limit measured in the same run.

Photographs: the real photographs that ship with scikit-image, scikit-learn and matplotlib (found on this
machine, none generated), plus ``--photos`` files; each is also cut into 4 corner crops for more samples.
Model: open_clip ViT-B-32 with random weights (seeded; nothing is downloaded), loaded once per precision
through ``hardrank.load_model`` (so the bf16 weights are the fp32 weights rounded), run through the
engine's ``PillowDecoder`` + ``ImageEncoder`` / ``TextEncoder`` stages.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
from pathlib import Path

_PHOTOS = {  # package -> real photographs in it (camera / scanner images, not drawings or renders)
    "skimage": ["data/astronaut.png", "data/chelsea.png", "data/coffee.png", "data/camera.png", "data/coins.png",
                "data/motorcycle_left.png", "data/rocket.jpg", "data/hubble_deep_field.jpg", "data/retina.jpg",
                "data/brick.png", "data/grass.png", "data/gravel.png", "data/moon.png", "data/page.png"],
    "sklearn": ["datasets/images/china.jpg", "datasets/images/flower.jpg"],
    "matplotlib": ["mpl-data/sample_data/grace_hopper.jpg"],
}

_CAPTIONS = ["an astronaut in a white suit standing in front of a flag", "a cat with striped fur looking at the camera",
             "a cup of coffee on a saucer on a wooden table", "a man holding a camera on a tripod in a field",
             "old coins lying on a dark cloth", "a red motorcycle parked on a street", "a rocket on a launch pad",
             "a chinese temple with a red roof among trees", "a yellow flower in close up",
             "a woman in a navy uniform with medals", "stars and galaxies in the night sky",
             "the surface of the moon with craters", "a printed page of text", "green grass in sunlight",
             "a brick wall", "gravel on the ground", "two dogs running on a beach",
             "a plate of food with broccoli and rice", "a bus driving down a city street at night",
             "people walking under umbrellas in the rain"]


def real_photos(extra: list[str]) -> list[str]:
    """Paths of the real photographs found on this machine (those missing are skipped), then ``extra``."""
    out = []
    for pkg, rels in _PHOTOS.items():
        spec = importlib.util.find_spec(pkg)
        if spec is None or not spec.submodule_search_locations:
            continue
        root = Path(list(spec.submodule_search_locations)[0])
        out += [str(root / r) for r in rels if (root / r).is_file()]
    return out + list(extra)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", default="ViT-B-32")
    ap.add_argument("--photos", nargs="*", default=[], help="more photograph files")
    ap.add_argument("--batch", type=int, default=64, help="images per timed encoder call")
    ap.add_argument("--seconds", type=float, default=4.0, help="time per throughput measurement")
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--json", default="benchmarks/results/bench_encode_precision.json")
    args = ap.parse_args()
    import numpy as np
    import open_clip
    import torch

    from hardrank import ModelSpec, load_model
    from hardrank.embed import ImageEncoder, PillowDecoder, TextEncoder
    from hardrank.items import ImageRef
    from hardrank.jobs.bench.timing import bare_gemm_gflops, best_of, image_flops, text_flops

    torch.set_num_threads(args.threads)
    photos = real_photos(args.photos)
    if not photos:
        raise SystemExit("no photographs found: install scikit-image / scikit-learn / matplotlib or pass --photos")
    from PIL import Image

    refs = []
    for p in photos:
        w, h = Image.open(p).size
        refs.append(ImageRef(p))
        cw, ch = max(1, int(w * 0.6)), max(1, int(h * 0.6))
        refs += [ImageRef(p, crop=(x, y, cw, ch)) for x in (0, w - cw) for y in (0, h - ch)]
    models = {}
    for prec in ("fp32", "bf16"):
        torch.manual_seed(0)  # the same random weights; bf16 = fp32 rounded
        models[prec] = load_model(ModelSpec(args.arch, None, prec, "cpu", random_init=True))
    m32, m16 = models["fp32"], models["bf16"]
    w32 = next(m32.model.parameters())
    assert torch.equal(w32.to(torch.bfloat16), next(m16.model.parameters())), "seeded loads differ"
    pix = PillowDecoder(m32.preprocess_cfg, threads=args.threads)({"ref": refs})
    assert pix["ok"].all(), pix["error"]
    emb = {p: ImageEncoder([m])({"pixels": pix["pixels"]})["emb0"] for p, m in models.items()}
    txt = {p: TextEncoder([m])({"text": _CAPTIONS})["emb0"] for p, m in models.items()}

    def diff(a, b):
        cos = (a * b).sum(1)
        sim_a, sim_b = a @ a.T, b @ b.T  # retrieval among the photos: does the nearest other item change?
        np.fill_diagonal(sim_a, -2), np.fill_diagonal(sim_b, -2)
        changed = int((sim_a.argmax(1) != sim_b.argmax(1)).sum())
        return {"max_abs_diff": float(np.abs(a - b).max()), "min_cosine": float(cos.min()),
                "mean_cosine": float(cos.mean()), "nearest_neighbour_changed": changed, "n": len(a)}

    cross = {p: emb[p] @ txt[p].T for p in models}  # (images, captions) scores: their ranking per image
    res = {"photos": photos, "images": len(refs), "arch": args.arch, "threads": args.threads,
           "image": diff(emb["fp32"], emb["bf16"]), "text": diff(txt["fp32"], txt["bf16"]),
           "i2t_top1_changed": int((cross["fp32"].argmax(1) != cross["bf16"].argmax(1)).sum()),
           "max_abs_score_diff": float(np.abs(cross["fp32"] - cross["bf16"]).max())}
    # throughput against the GEMM limit measured now, in both dtypes
    width = m32.model.visual.transformer.width
    tokens = args.batch * (1 + (m32.preprocess_cfg["size"] if isinstance(m32.preprocess_cfg["size"], int)
                                else m32.preprocess_cfg["size"][0]) ** 2 // m32.model.visual.patch_size[0] ** 2)
    x = torch.randn(args.batch, *pix["pixels"].shape[1:])
    texts = (_CAPTIONS * (args.batch // len(_CAPTIONS) + 1))[:args.batch]
    tok = m32.tokenizer(texts)
    # FLOPs from the architecture (torch's FLOP counter misses the fused inference attention's projections)
    cfg = open_clip.get_model_config(args.arch)
    f_img, f_txt = image_flops(cfg), text_flops(cfg, int(tok.argmax(-1).max()) + 1)  # texts at their trimmed length
    res["gemm_shape"] = [tokens, width, 4 * width]
    res["gflop_per_image"], res["gflop_per_text"] = f_img / 1e9, f_txt / 1e9
    res["throughput"], limits = {}, {}
    def gemm(dtype):  # the best rate of a bare (tokens, width) x (width, 4 width) GEMM, the encoder's largest
        return bare_gemm_gflops(tokens, 4 * width, width, "cpu", dtype, reps=1, min_s=1.5)

    for p, m in models.items():  # the limit: the best GEMM rate in windows before and after the encoders' timing
        ie, te = ImageEncoder([m]), TextEncoder([m])
        g0 = gemm(m.dtype)
        with torch.inference_mode():  # best items/s over --seconds, after one warm-up call
            r_img = len(x) / best_of(lambda: ie({"pixels": x}), repeat=1, min_s=args.seconds)
            r_txt = len(texts) / best_of(lambda: te({"text": texts}), repeat=1, min_s=args.seconds)
        limits[p] = max(g0, gemm(m.dtype))
        res["throughput"][p] = {
            "images_per_s": round(r_img, 1), "image_gflops": round(r_img * f_img / 1e9, 1),
            "image_fraction_of_gemm": round(r_img * f_img / 1e9 / limits[p], 3),
            "texts_per_s": round(r_txt, 1), "text_gflops": round(r_txt * f_txt / 1e9, 1),
            "text_fraction_of_gemm": round(r_txt * f_txt / 1e9 / limits[p], 3)}
    res["gemm_gflops"] = {p: round(v, 1) for p, v in limits.items()}
    t32, t16 = res["throughput"]["fp32"], res["throughput"]["bf16"]
    res["bf16_over_fp32"] = {"gemm": round(limits["bf16"] / limits["fp32"], 2),
                             "image": round(t16["images_per_s"] / t32["images_per_s"], 2),
                             "text": round(t16["texts_per_s"] / t32["texts_per_s"], 2)}
    res["machine"] = {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                      "loadavg": os.getloadavg(), "torch": torch.__version__,
                      "mkldnn_bf16": bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())}
    print(json.dumps({k: v for k, v in res.items() if k != "photos"}, indent=1))
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(res, indent=2))


if __name__ == "__main__":
    main()
