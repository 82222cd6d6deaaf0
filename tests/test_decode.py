"""The batched Pillow decoder against the model's own transform run image by image, on awkward images."""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from hardrank.embed import PillowDecoder, make_transform
from hardrank.embed.decode import _split_transform
from hardrank.items import ImageRef, decode_image, failure_reason

CFGS = {
    "toy-shortest-bicubic": {"size": 32, "mode": "RGB", "mean": (0.48145466, 0.4578275, 0.40821073),
                             "std": (0.26862954, 0.26130258, 0.27577711), "interpolation": "bicubic",
                             "resize_mode": "shortest", "fill_color": 0},
    "longest-pad": {"size": 48, "resize_mode": "longest", "interpolation": "bilinear", "fill_color": 7},
    "squash-rect": {"size": [40, 24], "resize_mode": "squash", "interpolation": "bicubic",
                    "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]},
}


def _photo(rng, w, h):
    """Smooth gradients plus noise: every resample weight matters."""
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([xx * 255 / max(w, 1), yy * 255 / max(h, 1), (xx + yy) * 127 / max(w + h, 1)], -1)
    return np.clip(base + rng.normal(0, 25, base.shape), 0, 255).astype(np.uint8)


def _awkward_images(folder, rng):
    """(name, path): every Pillow mode the loaders meet, extreme shapes, EXIF rotation, broken files."""
    out = []

    def save(name, img, fmt, **kw):
        p = folder / f"{name}.{fmt.lower()}"
        img.save(p, fmt, **kw)
        out.append((name, p))

    rgb = Image.fromarray(_photo(rng, 90, 60))
    save("rgb-jpeg", rgb, "JPEG", quality=90)
    save("rgb-png", rgb, "PNG")
    save("gray", rgb.convert("L"), "PNG")
    save("gray-alpha", rgb.convert("LA"), "PNG")
    rgba = rgb.convert("RGBA")
    rgba.putalpha(Image.fromarray(rng.integers(0, 256, (60, 90), dtype=np.uint8)))
    save("rgba", rgba, "PNG")
    save("cmyk-jpeg", rgb.convert("CMYK"), "JPEG", quality=92)
    save("palette", rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=37), "PNG")
    pt = rgb.convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    save("palette-transparent", pt, "PNG", transparency=3)
    save("bilevel", rgb.convert("1"), "PNG")
    save("i16", Image.fromarray(_photo(rng, 50, 40)[..., 0].astype(np.uint16) * 257), "PNG")
    save("tiny-1x1", Image.fromarray(_photo(rng, 1, 1)), "PNG")
    save("tiny-3x2", Image.fromarray(_photo(rng, 3, 2)), "JPEG", quality=95)
    save("wide-400x2", Image.fromarray(_photo(rng, 400, 2)), "PNG")
    save("tall-3x700", Image.fromarray(_photo(rng, 3, 700)), "JPEG", quality=85)
    save("big-1600x1200", Image.fromarray(_photo(rng, 1600, 1200)), "JPEG", quality=80)
    save("exact-size", Image.fromarray(_photo(rng, 32, 32)), "PNG")
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 CW to display (neither path applies it: the model's transform doesn't)
    save("exif-rotated", Image.fromarray(_photo(rng, 70, 40)), "JPEG", quality=90, exif=exif.tobytes())
    save("gif-frame", rgb.convert("P"), "GIF")
    save("webp", rgb, "WEBP", quality=80)
    data = (folder / "rgb-jpeg.jpeg").read_bytes()
    (folder / "truncated.jpg").write_bytes(data[: len(data) // 3])
    out.append(("truncated", folder / "truncated.jpg"))
    (folder / "garbage.jpg").write_bytes(b"not an image at all" * 10)
    out.append(("garbage", folder / "garbage.jpg"))
    (folder / "empty.png").write_bytes(b"")
    out.append(("empty", folder / "empty.png"))
    out.append(("missing", folder / "no-such-file.png"))
    return out


def _reference(cfg, ref):
    """The model's own transform on one image: (pixels, None), or (None, reason) where it fails."""
    try:
        return make_transform(cfg)(decode_image(ref)), None
    except Exception as exc:
        return None, failure_reason(exc)


@pytest.mark.parametrize("cfg_name", sorted(CFGS))
@pytest.mark.parametrize("threads", [1, 3])
def test_pillow_decoder_bit_identical_to_transform(tmp_path, cfg_name, threads):
    cfg = CFGS[cfg_name]
    images = _awkward_images(tmp_path, np.random.default_rng(0))
    refs = [ImageRef(str(p)) for _, p in images]
    refs += [ImageRef(str(images[0][1]), crop=(5, 7, 30, 11)), ImageRef(str(images[0][1]), crop=(0, 0, 1, 60))]
    names = [n for n, _ in images] + ["crop", "crop-1px"]
    dec = PillowDecoder(cfg, threads=threads)
    assert dec.fused, "the open_clip eval transform should take the batched path"
    out = dec({"ref": refs})
    assert out["pixels"].dtype == torch.float32 and out["pixels"].shape[1] == 3
    for i, (name, ref) in enumerate(zip(names, refs)):
        want, why = _reference(cfg, ref)
        if want is None:
            assert not out["ok"][i] and out["error"][i] == why, (name, out["error"][i], why)
            assert torch.count_nonzero(out["pixels"][i]) == 0, name
        else:
            assert out["ok"][i] and out["error"][i] is None, (name, out["error"][i])
            got = out["pixels"][i]
            assert got.shape == want.shape, name
            assert torch.equal(got, want), (name, float((got - want).abs().max()))
    broken = {"truncated", "garbage", "empty", "missing"}
    assert not any(out["ok"][i] for i, n in enumerate(names) if n in broken)


def test_pillow_decoder_batch_edges(tmp_path):
    """Empty batch, one image, more threads than images: same bits as the transform."""
    cfg = CFGS["toy-shortest-bicubic"]
    p = tmp_path / "a.png"
    Image.fromarray(_photo(np.random.default_rng(1), 33, 45)).save(p)
    dec = PillowDecoder(cfg, threads=8)
    empty = dec({"ref": []})
    assert empty["pixels"].shape == (0, 3, 32, 32) and len(empty["ok"]) == 0
    one = dec({"ref": [ImageRef(str(p))]})
    assert torch.equal(one["pixels"][0], make_transform(cfg)(decode_image(ImageRef(str(p)))))


def test_unfused_transform_runs_whole(tmp_path):
    """A transform the decoder cannot split (an extra tensor step) runs image by image, unchanged."""
    cfg = CFGS["toy-shortest-bicubic"]
    dec = PillowDecoder(cfg, threads=2)
    extra = torch.nn.Identity()
    dec.transform.transforms.append(extra)
    assert _split_transform(dec.transform) is None
    p = tmp_path / "a.jpg"
    Image.fromarray(_photo(np.random.default_rng(2), 50, 20)).save(p, quality=90)
    dec.fused = False
    out = dec({"ref": [ImageRef(str(p))]})
    want = make_transform(cfg)(decode_image(ImageRef(str(p))))
    assert torch.equal(out["pixels"][0], want)


def test_rgb_decode_skips_copy_but_matches_convert(tmp_path):
    """decode_image's RGB shortcut (no convert copy) gives the pixels convert('RGB') gives."""
    p = tmp_path / "a.jpg"
    Image.fromarray(_photo(np.random.default_rng(3), 64, 48)).save(p, quality=90)
    img = decode_image(ImageRef(str(p)))
    assert img.mode == "RGB"
    want = Image.open(io.BytesIO(p.read_bytes())).convert("RGB")
    assert np.array_equal(np.asarray(img), np.asarray(want))


@pytest.mark.parametrize("cfg_name", sorted(CFGS))
def test_pillow_draft_exact_where_it_cannot_reduce_and_close_where_it_does(tmp_path, cfg_name):
    """--decoder pillow-draft: identical bits for every image it cannot reduce (under 2x the resized size,
    not a JPEG, cropped, broken); on large JPEGs it reduces, and stays within a small bound of the reference."""
    cfg = CFGS[cfg_name]
    rng = np.random.default_rng(4)
    images = _awkward_images(tmp_path, rng)
    refs = [ImageRef(str(p)) for _, p in images] + [ImageRef(str(images[-6][1]), crop=(0, 0, 1500, 1100))]
    big = [n for n, _ in images] + ["crop-of-big"]
    dec = PillowDecoder(cfg, threads=2, draft=True)
    exact = PillowDecoder(cfg, threads=2)
    out, want = dec({"ref": refs}), exact({"ref": refs})
    assert list(out["ok"]) == list(want["ok"]) and out["error"] == want["error"]
    reduced = {"big-1600x1200"}  # the only JPEG at least 2x the model's resized size
    for i, name in enumerate(big):
        if name in reduced:
            continue
        assert torch.equal(out["pixels"][i], want["pixels"][i]), name
    for photo_size in [(640, 480), (1024, 768), (333, 1000)]:
        p = tmp_path / f"photo_{photo_size[0]}.jpg"
        Image.fromarray(_photo(rng, *photo_size)).save(p, quality=92)
        ref = ImageRef(str(p))
        got, ref_px = dec({"ref": [ref]})["pixels"][0], exact({"ref": [ref]})["pixels"][0]
        assert not torch.equal(got, ref_px)  # it did reduce
        # normalised pixels (std ~0.27: 1/255 of the range is ~0.015): mean error under 2 levels
        diff = (got - ref_px).abs()
        assert float(diff.mean()) < 0.03, (photo_size, float(diff.mean()))
    img = Image.open(tmp_path / "photo_640.jpg")
    need = dec.draft(*img.size)
    rw, rh = make_transform(cfg).transforms[0](Image.new("RGB", img.size)).size  # what the resize step makes
    assert need[0] >= rw and need[1] >= rh  # the reduced image still covers it
