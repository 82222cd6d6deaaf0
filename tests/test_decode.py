"""The batched Pillow decoder against the model's own transform run image by image, on awkward images."""
from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from helpers import PILLOW_MODES, pillow_mode_image, smooth_photo
from PIL import Image

from hardrank.embed import PillowDecoder, make_transform
from hardrank.encoding.decode import _split_transform
from hardrank.items import ImageRef, decode_image, failure_reason

CFGS = {
    "toy-shortest-bicubic": {"size": 32, "mode": "RGB", "mean": (0.48145466, 0.4578275, 0.40821073),
                             "std": (0.26862954, 0.26130258, 0.27577711), "interpolation": "bicubic",
                             "resize_mode": "shortest", "fill_color": 0},
    "longest-pad": {"size": 48, "resize_mode": "longest", "interpolation": "bilinear", "fill_color": 7},
    "squash-rect": {"size": [40, 24], "resize_mode": "squash", "interpolation": "bicubic",
                    "mean": [0.5, 0.5, 0.5], "std": [0.5, 0.5, 0.5]},
}


def _awkward_images(folder, rng):
    """(name, path): every Pillow mode the loaders meet, extreme shapes, EXIF rotation, broken files."""
    out = []

    def save(name, img, fmt, **kw):
        p = folder / f"{name}.{fmt.lower()}"
        img.save(p, fmt, **kw)
        out.append((name, p))

    rgb = Image.fromarray(smooth_photo(rng, 90, 60))
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
    save("i16", Image.fromarray(smooth_photo(rng, 50, 40)[..., 0].astype(np.uint16) * 257), "PNG")
    save("tiny-1x1", Image.fromarray(smooth_photo(rng, 1, 1)), "PNG")
    save("tiny-3x2", Image.fromarray(smooth_photo(rng, 3, 2)), "JPEG", quality=95)
    save("wide-400x2", Image.fromarray(smooth_photo(rng, 400, 2)), "PNG")
    save("tall-3x700", Image.fromarray(smooth_photo(rng, 3, 700)), "JPEG", quality=85)
    save("big-1600x1200", Image.fromarray(smooth_photo(rng, 1600, 1200)), "JPEG", quality=80)
    save("exact-size", Image.fromarray(smooth_photo(rng, 32, 32)), "PNG")
    exif = Image.Exif()
    exif[0x0112] = 6  # orientation: rotate 90 CW to display (neither path applies it: the model's transform doesn't)
    save("exif-rotated", Image.fromarray(smooth_photo(rng, 70, 40)), "JPEG", quality=90, exif=exif.tobytes())
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
    """open_clip's transform on one image as its users load it: (pixels, None), or (None, the reason the
    decoder records) where the file cannot be read. Uncropped: ``Image.open(path)`` as it is; a crop box:
    ``Image.open(path).convert('RGB').crop(box)``, as ARO's loader does."""
    try:
        decode_image(ref)  # an unreadable file: the reason as the decoder words it
        with Image.open(ref.uri) as im:
            if ref.crop is not None:
                x, y, w, h = ref.crop
                im = im.convert("RGB").crop((int(x), int(y), int(x + w), int(y + h)))
            return _open_clip_transform(cfg)(im), None
    except Exception as exc:  # also where the transform itself fails (a 400x2 image resized to fit: 0 rows)
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


def _open_clip_transform(cfg):
    """open_clip's own eval transform for ``cfg``, built by open_clip (not by hardrank's make_transform)."""
    import open_clip

    return open_clip.image_transform(cfg["size"] if isinstance(cfg["size"], int) else tuple(cfg["size"]),
                                     is_train=False, mean=cfg.get("mean"), std=cfg.get("std"),
                                     resize_mode=cfg.get("resize_mode"), interpolation=cfg.get("interpolation"),
                                     fill_color=cfg.get("fill_color", 0))


@pytest.mark.parametrize("mode", PILLOW_MODES)
@pytest.mark.parametrize("cfg_name", sorted(CFGS))
@pytest.mark.parametrize("draft", [False, True], ids=["pillow", "pillow-draft"])
def test_every_pillow_mode_gets_open_clips_own_transform_bit_for_bit(tmp_path, mode, cfg_name, draft):
    """``preprocess(Image.open(path))`` as open_clip's users run it: open_clip resizes and crops in the image's
    own mode and converts to RGB after (a palette image resizes with nearest, alpha premultiplied, 16-bit
    values before clipping), so the decoder must not convert first. pillow-draft reduces no image here (none
    is a JPEG of twice the resized size), so it must give the same bits too; and the image-by-image path
    (a transform the decoder cannot split) as well."""
    cfg = CFGS[cfg_name]
    p, opened = pillow_mode_image(tmp_path, mode)
    with Image.open(p) as im:
        assert im.mode == opened  # the case really is the mode it names
        want = _open_clip_transform(cfg)(im)
    dec = PillowDecoder(cfg, threads=2, draft=draft)
    unfused = PillowDecoder(cfg, threads=1, draft=draft)
    unfused.fused = False
    for d in (dec, unfused):
        out = d({"ref": [ImageRef(str(p)), ImageRef(str(p))]})  # two rows: the batched path
        assert out["ok"].all(), out["error"]
        for got in out["pixels"]:
            assert torch.equal(got, want), (mode, d.fused, float((got - want).abs().max()))


def test_an_animated_gif_is_its_first_frame_as_pillow_opens_it(tmp_path):
    rng = np.random.default_rng(6)
    frames = [Image.fromarray(smooth_photo(rng, 64, 48)).convert("P", palette=Image.Palette.ADAPTIVE, colors=32)
              for _ in range(3)]
    p = tmp_path / "anim.gif"
    frames[0].save(p, "GIF", save_all=True, append_images=frames[1:], duration=40, loop=0)
    cfg = CFGS["toy-shortest-bicubic"]
    got = PillowDecoder(cfg, threads=1)({"ref": [ImageRef(str(p))]})["pixels"][0]
    with Image.open(p) as im:
        assert im.n_frames == 3
        first = _open_clip_transform(cfg)(im)
        im.seek(1)
        second = _open_clip_transform(cfg)(im)
    assert torch.equal(got, first) and not torch.equal(got, second)


def test_a_cropped_region_is_converted_then_cropped_as_aros_loader_does(tmp_path):
    """ARO (and the hard-positive SWAP crops) load ``Image.open(p).convert('RGB').crop(box)``: the crop's
    padding outside the image is black even for a palette image whose index 0 is not."""
    rng = np.random.default_rng(7)
    pal = Image.fromarray(smooth_photo(rng, 60, 40)).convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    pal.putpalette([250, 10, 10] + list(pal.getpalette()[3:]))  # index 0 is red
    p = tmp_path / "pal.png"
    pal.save(p)
    cfg = CFGS["toy-shortest-bicubic"]
    box = (40, 20, 50, 40)  # runs past the right and bottom edges
    got = PillowDecoder(cfg, threads=1)({"ref": [ImageRef(str(p), crop=box)]})["pixels"][0]
    with Image.open(p) as im:
        want = _open_clip_transform(cfg)(im.convert("RGB").crop((40, 20, 90, 60)))
    assert torch.equal(got, want)


def test_pillow_decoder_batch_edges(tmp_path):
    """Empty batch, one image, more threads than images: same bits as the transform."""
    cfg = CFGS["toy-shortest-bicubic"]
    p = tmp_path / "a.png"
    Image.fromarray(smooth_photo(np.random.default_rng(1), 33, 45)).save(p)
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
    Image.fromarray(smooth_photo(np.random.default_rng(2), 50, 20)).save(p, quality=90)
    dec.fused = False
    out = dec({"ref": [ImageRef(str(p))]})
    want = make_transform(cfg)(decode_image(ImageRef(str(p))))
    assert torch.equal(out["pixels"][0], want)


def test_rgb_decode_skips_copy_but_matches_convert(tmp_path):
    """decode_image's RGB shortcut (no convert copy) gives the pixels convert('RGB') gives."""
    p = tmp_path / "a.jpg"
    Image.fromarray(smooth_photo(np.random.default_rng(3), 64, 48)).save(p, quality=90)
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
        Image.fromarray(smooth_photo(rng, *photo_size)).save(p, quality=92)
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
