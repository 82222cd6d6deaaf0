"""RoCOCO image alteration: the batched torch path against a per-image numpy loop, RNG, I/O contract."""

import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision import transforms
from torchvision.transforms import InterpolationMode

from hardrank.perturb.images import (
    _alter_batch,
    _altered_batches,
    _load,
    _plan,
    _rand_box,
    alter_images,
    variant_name,
)

SIZE = 24


# ---- slow, obviously correct twins -------------------------------------------------------------

def _ref_plan(n, seed, batch_size=64, size=SIZE, lam=0.9):
    """What the reference script draws: a shuffled torch DataLoader, then randperm / np randint per batch."""
    with torch.random.fork_rng():
        state = np.random.get_state()
        try:
            torch.manual_seed(seed)
            np.random.seed(seed)
            loader = torch.utils.data.DataLoader(list(range(n)), batch_size=batch_size, shuffle=True)
            out = []
            for batch in loader:
                perm = torch.randperm(len(batch)).tolist()
                cut = np.sqrt(1.0 - lam)
                cw, ch = int(size * cut), int(size * cut)
                cx, cy = np.random.randint(size), np.random.randint(size)
                box = (int(np.clip(cx - cw // 2, 0, size)), int(np.clip(cy - ch // 2, 0, size)),
                       int(np.clip(cx + cw // 2, 0, size)), int(np.clip(cy + ch // 2, 0, size)))
                out.append((batch.tolist(), perm, box))
            return out
        finally:
            np.random.set_state(state)


def _ref_load(path, size=SIZE):
    """The reference transform: torchvision Resize((S, S), bicubic) + ToTensor, as (S, S, 3) float32."""
    tf = transforms.Compose([transforms.Resize((size, size), interpolation=InterpolationMode.BICUBIC),
                             transforms.ToTensor()])
    with Image.open(path) as im:
        return tf(im.convert("RGB")).permute(1, 2, 0).numpy()


def _ref_alter_one(images, j, batch_idx, perm, method, lam, box):
    """One output image, pixel by pixel in numpy: (H, W, 3) uint8. images: (S, S, 3) float32 in [0, 1]."""
    x, y = images[batch_idx[j]], images[batch_idx[perm[j]]]
    if method == "mix":
        out = lam * x + (1 - lam) * y
    else:
        out = x.copy()
        r1, c1, r2, c2 = box
        for r in range(r1, r2):
            for c in range(c1, c2):
                out[r, c] = y[r, c]
    return np.clip(out * np.float32(255) + np.float32(0.5), 0, 255).astype(np.uint8)


# ---- fixtures ----------------------------------------------------------------------------------

def _make_images(root: Path, n: int, size=SIZE, ext=".jpg", smooth=False):
    rng = np.random.default_rng(123)
    rels = []
    for i in range(n):
        rel = f"val/img_{i:03d}{ext}"
        (root / "val").mkdir(parents=True, exist_ok=True)
        h, w = size + i % 3, size + 2 * (i % 2)  # awkward sizes: most images get resized
        if smooth:  # a flat colour per image: JPEG keeps it nearly exact
            arr = np.broadcast_to(rng.integers(0, 256, 3, dtype=np.uint8), (h, w, 3)).copy()
        else:
            arr = rng.integers(0, 256, (h, w, 3), dtype=np.uint8)
        Image.fromarray(arr).save(root / rel, **({"quality": 95} if ext == ".jpg" else {}))
        rels.append(rel)
    return rels


# ---- tests -------------------------------------------------------------------------------------

@pytest.mark.parametrize("n,seed", [(1, 1), (63, 1), (64, 10), (65, 100), (150, 1)])
def test_plan_matches_reference_rng(n, seed):
    mine = [(b.indices, b.perm, b.box) for b in _plan(n, method="patch", lam=0.9, seed=seed, size=SIZE)]
    assert mine == _ref_plan(n, seed)


def test_plan_leaves_global_rng_alone():
    torch.manual_seed(5)
    np.random.seed(5)
    a_t, a_n = torch.rand(3), np.random.rand(3)
    torch.manual_seed(5)
    np.random.seed(5)
    _plan(100, method="patch", lam=0.9, seed=1, size=SIZE)
    assert torch.equal(torch.rand(3), a_t) and np.array_equal(np.random.rand(3), a_n)


@pytest.mark.parametrize("method", ["mix", "patch"])
@pytest.mark.parametrize("lam", [0.9, 0.5, 0.0, 1.0])
def test_altered_pixels_match_per_image_loop(tmp_path, method, lam):
    """Decode, resize, batch, alter and quantise exactly as the reference, before JPEG."""
    rels = _make_images(tmp_path, 11)
    ref_images = [_ref_load(tmp_path / r) for r in rels]
    plan = _plan(len(rels), method=method, lam=lam, seed=1, size=SIZE, batch_size=4)
    got = list(_altered_batches(plan, lambda idx: [_load(tmp_path / rels[i], SIZE) for i in idx],
                                method=method, lam=lam))
    assert [b for b, _ in got] == plan
    for b, y in got:
        assert y.dtype == np.uint8 and y.shape == (len(b.indices), SIZE, SIZE, 3)
        for j in range(len(b.indices)):
            np.testing.assert_array_equal(y[j], _ref_alter_one(ref_images, j, b.indices, b.perm, method, lam, b.box))


class _FixedRS:
    """Stands in for np.random.RandomState: returns preset centres."""

    def __init__(self, *vals):
        self.vals = list(vals)

    def randint(self, high):
        v = self.vals.pop(0)
        assert 0 <= v < high
        return v


@pytest.mark.parametrize("size,lam,centre,want", [
    (384, 0.9, (0, 0), (0, 0, 60, 60)),             # cut = int(384*0.316) = 121, half 60, clipped at 0
    (384, 0.9, (383, 383), (323, 323, 384, 384)),   # clipped at the far edge
    (384, 0.9, (200, 17), (140, 0, 260, 77)),       # width 2*60 = 120, not 121 (the reference's quirk)
    (64, 0.0, (32, 32), (0, 0, 64, 64)),            # lam 0: the whole image
    (64, 0.0, (31, 0), (0, 0, 63, 32)),
    (64, 1.0, (10, 20), (10, 20, 10, 20)),          # lam 1: empty box
    (7, 0.5, (6, 0), (4, 0, 7, 2)),                 # odd size: cut = int(7*0.707) = 4, half 2
])
def test_patch_box_edges(size, lam, centre, want):
    assert _rand_box(_FixedRS(*centre), size, size, lam) == want


def test_patch_only_changes_box(tmp_path):
    x = torch.rand(5, 3, 16, 16)
    perm = torch.tensor([1, 0, 2, 4, 3])
    y = _alter_batch(x, perm, method="patch", lam=0.5, box=(2, 3, 9, 16))
    inside = torch.zeros(16, 16, dtype=torch.bool)
    inside[2:9, 3:16] = True
    assert torch.equal(y[:, :, ~inside], x[:, :, ~inside])
    assert torch.equal(y[:, :, inside], x[perm][:, :, inside])
    assert torch.equal(y[2], x[2])  # a self-pair is unchanged


def test_alter_images_writes_reference_pixels(tmp_path):
    rels = _make_images(tmp_path / "in", 70, smooth=True)
    images = [_ref_load(tmp_path / "in" / r) for r in rels]
    rep = alter_images(tmp_path / "in", rels, tmp_path / "out", method="patch", lam=0.9, seed=1, size=SIZE,
                       quality=100, device="cpu")
    plan = _ref_plan(len(rels), 1)
    assert rep["images"] == 70 and rep["written"] == 70
    assert rep["self_pairs"] == sum(int(p == j) for _, perm, _ in plan for j, p in enumerate(perm))
    assert rep["out_dir"] == str(tmp_path / "out" / "patch_0.9_s1")
    for idx, perm, box in plan:
        for j in range(len(idx)):
            want = _ref_alter_one(images, j, idx, perm, "patch", 0.9, box)
            with Image.open(Path(rep["out_dir"]) / rels[idx[j]]) as im:
                assert im.format == "JPEG" and im.size == (SIZE, SIZE)
                got = np.asarray(im.convert("RGB")).astype(int)
            assert np.median(np.abs(got - want)) <= 1  # JPEG q100 of flat colours; 4:2:0 chroma blurs box edges


def test_self_pairs_single_image(tmp_path):
    rels = _make_images(tmp_path, 1)
    rep = alter_images(tmp_path, rels, tmp_path / "o", method="mix", size=SIZE, device="cpu")
    assert rep["self_pairs"] == 1


def test_seed_changes_permutation_and_output(tmp_path):
    a = _plan(200, method="mix", lam=0.9, seed=1, size=SIZE)
    b = _plan(200, method="mix", lam=0.9, seed=10, size=SIZE)
    assert [x.indices for x in a] != [x.indices for x in b] and [x.perm for x in a] != [x.perm for x in b]
    rels = _make_images(tmp_path / "in", 20)
    r1 = alter_images(tmp_path / "in", rels, tmp_path / "out", method="mix", seed=1, size=SIZE, device="cpu")
    r2 = alter_images(tmp_path / "in", rels, tmp_path / "out", method="mix", seed=10, size=SIZE, device="cpu")
    assert Path(r2["out_dir"]).name == "mix_0.9_s10"
    differ = [(Path(r1["out_dir"]) / r).read_bytes() != (Path(r2["out_dir"]) / r).read_bytes() for r in rels]
    assert sum(differ) > len(rels) // 2


def test_resumable(tmp_path):
    rels = _make_images(tmp_path / "in", 9)
    kw = dict(method="mix", lam=0.9, seed=1, size=SIZE, batch_size=4, device="cpu")
    rep = alter_images(tmp_path / "in", rels, tmp_path / "out", **kw)
    out = Path(rep["out_dir"])
    before = {r: (out / r).read_bytes() for r in rels}
    mtimes = {r: os.stat(out / r).st_mtime_ns for r in rels}
    (out / rels[5]).unlink()
    rep2 = alter_images(tmp_path / "in", rels, tmp_path / "out", **kw)
    assert rep2["written"] == 1 and rep2["skipped"] == 8 and rep2["self_pairs"] == rep["self_pairs"]
    assert {r: (out / r).read_bytes() for r in rels} == before  # deterministic regeneration
    assert all(os.stat(out / r).st_mtime_ns == mtimes[r] for r in rels if r != rels[5])
    assert not list(out.rglob("*.tmp"))
    # a fully done batch is not even decoded: break an input whose batch is complete
    (tmp_path / "in" / rels[0]).write_bytes(b"garbage")
    assert alter_images(tmp_path / "in", rels, tmp_path / "out", **kw)["written"] == 0


def test_png_input_keeps_relative_path_with_jpg_name(tmp_path):
    rels = _make_images(tmp_path / "in", 3, ext=".png")
    rep = alter_images(tmp_path / "in", rels, tmp_path / "out", method="patch", size=SIZE, device="cpu")
    for r in rels:
        assert (tmp_path / "out" / "patch_0.9_s1" / Path(r).with_suffix(".jpg")).is_file()
    assert rep["images"] == 3


def test_corrupt_and_missing_inputs_name_the_file(tmp_path):
    rels = _make_images(tmp_path / "in", 3)
    (tmp_path / "in" / rels[1]).write_bytes(b"not a jpeg at all")
    with pytest.raises(ValueError, match=r"cannot decode image .*img_001\.jpg"):
        alter_images(tmp_path / "in", rels, tmp_path / "out", method="mix", size=SIZE, device="cpu")
    with pytest.raises(ValueError, match=r"image not found: .*nope\.jpg"):
        alter_images(tmp_path / "in", rels[:1] + ["val/nope.jpg"], tmp_path / "o2", method="mix", size=SIZE,
                     device="cpu")


def test_argument_errors(tmp_path):
    with pytest.raises(ValueError, match="method must be one of"):
        alter_images(tmp_path, [], tmp_path, method="blend")
    with pytest.raises(ValueError, match=r"lam must be a number in \[0, 1\]"):
        alter_images(tmp_path, [], tmp_path, method="mix", lam=1.5)
    with pytest.raises(ValueError, match="same output"):
        alter_images(tmp_path, ["a/x.png", "a/x.jpg"], tmp_path, method="mix")
    with pytest.raises(ValueError, match="relative to images_root"):
        alter_images(tmp_path, ["../x.jpg"], tmp_path, method="mix")


def test_variant_name():
    assert variant_name("mix", 0.9, 1) == "mix_0.9_s1"
    assert variant_name("patch", 1, 100) == "patch_1.0_s100"
