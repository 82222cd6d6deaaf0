"""Make corruptions_reference.npz: imagecorruptions 1.1.2's outputs on one fixed image, the oracle of test_corruptions.

Run it in a scratch venv, never the project's (the library needs scipy, scikit-image and OpenCV, and numpy's global
RNG): python3 -m venv /tmp/icv && /tmp/icv/bin/pip install imagecorruptions==1.1.2 && /tmp/icv/bin/python THIS.
Two shims let 1.1.2 run on numpy 2 / scikit-image >= 0.19 (np.float_ and gaussian(multichannel=) were removed);
they change no arithmetic. impulse_noise's scikit-image Generator is seeded as hardrank seeds it (an int drawn from
the image's RandomState), every other draw comes from numpy's global RNG seeded per case, in the library's order.
"""
import sys
from pathlib import Path

import numpy as np

np.float_ = np.float64  # removed in numpy 2; plasma_fractal (fog) names it
import imagecorruptions.corruptions as icc  # noqa: E402
import skimage as sk  # noqa: E402
from imagecorruptions import corrupt, get_corruption_names  # noqa: E402
from skimage.filters import gaussian as _gaussian  # noqa: E402

icc.gaussian = lambda img, sigma, multichannel=False, **kw: _gaussian(
    img, sigma=sigma, channel_axis=-1 if multichannel else None, **kw)
_random_noise = sk.util.random_noise
sk.util.random_noise = lambda img, **kw: _random_noise(img, rng=np.random.default_rng(int(np.random.randint(2 ** 31))),
                                                       **kw)


def reference_image(h: int = 36, w: int = 44) -> np.ndarray:
    """Gradients, a bright square and a checkerboard: every corruption has edges, flats and colour to act on."""
    r, c = np.mgrid[0:h, 0:w]
    x = np.stack([255 * c / (w - 1), 255 * r / (h - 1), 128 + 100 * np.sin(r / 3.0) * np.cos(c / 4.0)], axis=-1)
    x[8:20, 10:24] = (240, 230, 20)
    x[((r // 4 + c // 4) % 2 == 0) & (r > 24)] *= 0.3
    return np.clip(x, 0, 255).astype(np.uint8)


def case_seed(i: int, severity: int) -> int:
    return 1000 * i + severity


def main(out: Path) -> None:
    x = reference_image()
    names = get_corruption_names("common")
    outs = {}
    for i, name in enumerate(names):
        for s in range(1, 6):
            np.random.seed(case_seed(i, s))
            outs[f"{name}_{s}"] = corrupt(x, corruption_name=name, severity=s)
    np.savez_compressed(out, image=x, **outs)
    print(f"{out}: {len(outs)} outputs of {x.shape}, {out.stat().st_size} bytes")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).with_name("corruptions_reference.npz"))
