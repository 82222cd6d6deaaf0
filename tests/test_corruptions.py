"""ImageNet-C corruptions: against imagecorruptions' recorded outputs; determinism, severities, files, errors."""

import importlib.util
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from hardrank.errors import DataError, MissingExtra, UsageError
from hardrank.jobs.cli import main
from hardrank.perturb import corruptions as C
from hardrank.perturb import perturb_images
from hardrank.perturb.corruptions import CORRUPTIONS, corrupt, corrupt_images, parse_corruptions, variant_name
from hardrank.perturb.shards import corrupt_shards

REFERENCE = Path(__file__).parent / "golden" / "corruptions_reference.npz"
# hardrank's numpy stand-ins for scikit-image's Gaussian and HSV round trip differ from them in the last float bits:
# a pixel here and there truncates one level lower or higher. frost scales its photograph with PIL's bicubic, the
# library with OpenCV's (another cubic kernel): a few levels.
TOLERANCE = {"glass_blur": (1, 0.1), "brightness": (1, 0.1), "frost": (4, 0.5)}  # (max, mean) |difference|


def _frost_dir(tmp_path: Path) -> Path:
    """Six stand-in frost photographs (the real ones come with imagecorruptions): smooth, of differing sizes."""
    d = tmp_path / "frost"
    d.mkdir(exist_ok=True)
    rng = np.random.default_rng(7)
    for i, f in enumerate(C.FROST_FILES):
        h, w = 40 + 7 * i, 52 + 5 * i
        arr = (rng.random((h // 4 + 1, w // 4 + 1, 3)) * 255).astype(np.uint8)
        Image.fromarray(arr).resize((w, h), Image.BILINEAR).save(d / f)
    return d


def _image(h=32, w=40, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    r, c = np.mgrid[0:h, 0:w]
    x = np.stack([4 * c + 30, 5 * r + 20, 100 + 60 * np.sin(c / 3.0)], axis=-1) + rng.normal(0, 8, (h, w, 3))
    return np.clip(x, 0, 255).astype(np.uint8)


@pytest.mark.parametrize("name", CORRUPTIONS)
def test_matches_imagecorruptions_reference(name):
    """Each corruption at each severity against imagecorruptions 1.1.2 on the same image, the same draws (the
    fixture's RNG seeded per case, as tests/golden/make_corruptions_reference.py records it)."""
    ref = np.load(REFERENCE)
    x = ref["image"]
    frost_dir = None
    if name == "frost":
        spec = importlib.util.find_spec("imagecorruptions")
        if spec is None:
            pytest.skip("the real frost photographs come with imagecorruptions (pip install 'hardrank[corrupt]')")
        frost_dir = Path(list(spec.submodule_search_locations)[0]) / "frost"
    top, mean = TOLERANCE.get(name, (0, 0.0))
    for s in range(1, 6):
        y = corrupt(x, name, s, np.random.RandomState(1000 * CORRUPTIONS.index(name) + s), frost_dir)
        d = np.abs(y.astype(int) - ref[f"{name}_{s}"].astype(int))
        assert y.shape == x.shape and y.dtype == np.uint8
        assert d.max() <= top and d.mean() <= mean, (name, s, int(d.max()), float(d.mean()))


def test_each_corruption_changes_the_image_and_keeps_shape(tmp_path):
    frost_dir = _frost_dir(tmp_path)
    x = _image()
    for name in CORRUPTIONS:
        for s in range(1, 6):
            y = corrupt(x, name, s, np.random.RandomState(s), frost_dir)
            assert y.shape == x.shape and y.dtype == np.uint8, (name, s)
            assert np.abs(y.astype(int) - x).mean() > 0.5, (name, s)


def _spread(name: str, stat) -> list[float]:
    x = _image(48, 48)
    return [stat(x, corrupt(x, name, s, np.random.RandomState(0))) for s in range(1, 6)]


def test_severity_is_monotonic_where_the_parameters_are():
    noise = lambda x, y: float((y.astype(float) - x).std())
    assert np.all(np.diff(_spread("gaussian_noise", noise)) > 0)
    assert np.all(np.diff(_spread("shot_noise", noise)) > 0)
    assert np.all(np.diff(_spread("impulse_noise", lambda x, y: float((y != x).mean()))) > 0)
    assert np.all(np.diff(_spread("contrast", lambda x, y: float(y.astype(float).std()))) < 0)
    assert np.all(np.diff(_spread("brightness", lambda x, y: float(y.mean()))) > 0)
    tv = lambda x, y: float(np.abs(np.diff(y.astype(float), axis=1)).mean())
    assert np.all(np.diff(_spread("defocus_blur", tv)) < 0)


def test_frost_is_the_published_blend(tmp_path):
    """clip(c0 * x + c1 * frost): a flat grey texture makes the crop's position irrelevant."""
    d = tmp_path / "flat"
    d.mkdir()
    for f in C.FROST_FILES:
        Image.fromarray(np.full((50, 60, 3), 100, np.uint8)).save(d / f)
    x = _image()
    for s, (c0, c1) in enumerate([(1, 0.4), (0.8, 0.6), (0.7, 0.7), (0.65, 0.7), (0.6, 0.75)], start=1):
        want = np.uint8(np.clip(c0 * x.astype(float) + c1 * 100, 0, 255))
        assert np.abs(corrupt(x, "frost", s, np.random.RandomState(0), d).astype(int) - want).max() <= 1


def test_corruption_leaves_global_rng_alone(tmp_path):
    np.random.seed(5)
    want = np.random.rand(3)
    np.random.seed(5)
    for name in CORRUPTIONS:
        corrupt(_image(), name, 3, np.random.RandomState(1), _frost_dir(tmp_path))
    assert np.array_equal(np.random.rand(3), want)


def _folder(root: Path) -> list[str]:
    """An ImageFolder tree: JPEG and PNG, two sizes."""
    rels = []
    for i in range(4):
        rel = f"{'cat' if i % 2 else 'dog'}/{i}.{'png' if i == 3 else 'jpg'}"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(_image(32 + 4 * i, 36, seed=i)).save(root / rel)
        rels.append(rel)
    return sorted(rels)


def _bytes(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_folder_layout_determinism_and_resume(tmp_path):
    rels = _folder(tmp_path / "a")
    _folder(tmp_path / "b")
    kw = dict(corruptions=("gaussian_noise", "glass_blur"), severities=(1, 5), seed=0)
    rep = corrupt_images(tmp_path / "a", rels, tmp_path / "a", **kw)
    assert rep["written"] == 16 and rep["variants"] == ["gaussian_noise_1_s0", "gaussian_noise_5_s0",
                                                        "glass_blur_1_s0", "glass_blur_5_s0"]
    for v in rep["variants"]:  # same relative paths, same suffixes
        assert sorted(_bytes(tmp_path / "a" / v)) == rels
    assert Image.open(tmp_path / "a" / "gaussian_noise_1_s0" / "cat/3.png").format == "PNG"
    # same seed, another order and another run: identical bytes; another seed: other noise
    corrupt_images(tmp_path / "b", rels[::-1], tmp_path / "b", **kw)
    for v in rep["variants"]:
        assert _bytes(tmp_path / "a" / v) == _bytes(tmp_path / "b" / v)
    other = corrupt_images(tmp_path / "b", rels, tmp_path / "b", **{**kw, "seed": 1})
    assert _bytes(tmp_path / "b" / "gaussian_noise_1_s1") != _bytes(tmp_path / "a" / "gaussian_noise_1_s0")
    assert other["written"] == 16
    # resumable: nothing to do, then only the removed file is rewritten, with the same bytes
    removed = tmp_path / "a" / "glass_blur_5_s0" / rels[0]
    before = removed.read_bytes()
    removed.unlink()
    again = corrupt_images(tmp_path / "a", rels, tmp_path / "a", **kw)
    assert (again["written"], again["skipped"]) == (1, 15) and removed.read_bytes() == before
    assert not list((tmp_path / "a").rglob("*.tmp"))


def test_walk_skips_variant_folders(tmp_path):
    rels = _folder(tmp_path)
    corrupt_images(tmp_path, rels, tmp_path, corruptions=("contrast",), severities=(2,), seed=3)
    assert C.walk_images(tmp_path) == rels


def test_perturb_images_command_on_an_image_folder(tmp_path, capsys):
    (tmp_path / "if").mkdir()
    rels = _folder(tmp_path / "if")
    out_dir = tmp_path / "if-variants"  # beside the ImageFolder root (tests/test_faults.py: not inside it)
    args = ["perturb", "images", "--method", "corrupt:jpeg_compression,pixelate", "--severity", "1", "5",
            "--seed", "0", "--images", str(tmp_path / "if"), "--out", str(out_dir)]
    assert main(args) == 0
    out, err = capsys.readouterr()
    report = json.loads(out)
    assert report["written"] == 16 and report["images"] == 4 and report["seconds"] >= 0
    assert (f"--variants-dir {out_dir} --image-variants jpeg_compression_1 jpeg_compression_5 pixelate_1 pixelate_5 "
            f"--seeds 0") in err
    assert sorted(_bytes(out_dir / "pixelate_5_s0")) == rels
    assert main(args) == 0 and json.loads(capsys.readouterr()[0])["skipped"] == 16


def test_corrupt_all_names_every_corruption():
    assert parse_corruptions("corrupt:all") == CORRUPTIONS
    assert parse_corruptions("corrupt:fog, snow,fog") == ("fog", "snow")
    assert variant_name("gaussian_noise", 3, 0) == "gaussian_noise_3_s0"


def test_bad_inputs_are_clear_errors(tmp_path, capsys, monkeypatch):
    with pytest.raises(UsageError, match="gaussian_noise, shot_noise, impulse_noise, .*jpeg_compression"):
        parse_corruptions("corrupt:gausian_noise")
    for bad in (0, 6, True, 2.0):
        with pytest.raises(UsageError, match=r"severity must be an int in 1\.\.5"):
            corrupt(_image(), "fog", bad, np.random.RandomState(0))
    with pytest.raises(DataError, match=r"31x40 px is too small.*>= 32 px"):
        corrupt(_image(40, 31), "fog", 1, np.random.RandomState(0))
    with pytest.raises(UsageError, match=r"\(H, W, 3\) uint8"):
        corrupt(_image().astype(np.float32), "fog", 1, np.random.RandomState(0))
    images, out = tmp_path / "if", tmp_path / "v"
    images.mkdir()
    _folder(images)
    base = ["perturb", "images", "--images", str(images), "--out", str(out)]
    assert main([*base, "--method", "corrupt:nope"]) == 2
    assert "the 15 ImageNet-C corruptions are: gaussian_noise" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_:  # argparse's own choices check
        main([*base, "--method", "corrupt:fog", "--severity", "6"])
    assert exit_.value.code == 2 and "invalid choice: 6" in capsys.readouterr().err
    assert main([*base, "--method", "blur"]) == 2
    assert "mix', 'patch'] or corrupt:<name>" in capsys.readouterr().err
    # frost without the extra (and no --frost-dir): exit 1 naming the install line, before any image is written
    monkeypatch.setattr(C.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(MissingExtra, match=r"pip install 'hardrank\[corrupt\]'"):
        perturb_images(method="corrupt:frost", images=str(images), out=str(out))
    assert main([*base, "--method", "corrupt:fog,frost"]) == 1
    assert "pip install 'hardrank[corrupt]'" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(DataError, match="frost1.png not found; --frost-dir must hold"):
        perturb_images(method="corrupt:frost", images=str(images), out=str(out), frost_dir=str(images))
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match="holds no image files"):
        perturb_images(method="corrupt:fog", images=str(empty), out=str(out))


def test_corrupt_shards_keep_keys_texts_and_resume(tmp_path):
    import webdataset as wds

    src = tmp_path / "shards"
    src.mkdir()
    for s in range(2):
        with wds.TarWriter(str(src / f"{s:05d}.tar")) as w:
            for i in range(3 * s, 3 * s + 3):
                buf = Image.fromarray(_image(seed=i))
                w.write({"__key__": f"{i:06d}", "png" if i == 4 else "jpg": buf, "txt": f"caption {i}"})
    spec = str(src / "{00000..00001}.tar")
    rep = corrupt_shards(spec, None, corruptions=("shot_noise",), severities=(2, 4), seed=0)
    assert rep["written"] == 12 and rep["variants"] == ["shot_noise_2_s0", "shot_noise_4_s0"]
    with tarfile.open(src / "shot_noise_2_s0" / "00001.tar") as tf:
        names = tf.getnames()
        assert names == ["000003.jpg", "000003.txt", "000004.png", "000004.txt", "000005.jpg", "000005.txt"]
        assert tf.extractfile("000004.txt").read() == b"caption 4"
        assert Image.open(tf.extractfile("000004.png")).size == (40, 32)
    before = (src / "shot_noise_4_s0" / "00000.tar").read_bytes()
    (src / "shot_noise_4_s0" / "00000.tar").unlink()
    again = corrupt_shards(spec, None, corruptions=("shot_noise",), severities=(2, 4), seed=0)
    assert (again["written"], again["skipped"]) == (3, 9)
    assert (src / "shot_noise_4_s0" / "00000.tar").read_bytes() == before
