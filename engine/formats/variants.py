"""Variant names and kinds, written once: RoCOCO's text variants, image variant folders ``<name>_s<seed>`` and
ImageNet-C's corruptions (``hardrank perturb`` writes them, the suites read them back)."""
from __future__ import annotations

__all__ = ["TEXT_VARIANTS", "N_PERTURBED", "IMAGE_CORRUPTIONS", "SEVERITIES", "image_variant_names",
           "is_corruption_variant", "variant_hint", "variants_beside"]

TEXT_VARIANTS = ("same_concept", "diff_concept", "rand_voca", "danger")


N_PERTURBED = 5


def image_variant_names(variants, seeds) -> list[str]:
    return [f"{v}_s{s}" for v in variants for s in seeds]


# The ImageNet-C corruptions `hardrank perturb images --method corrupt:...` writes as <name>_<severity>_s<seed>.
# Such a variant is both a gallery distractor and a query: its own i2t task against the clean captions.
IMAGE_CORRUPTIONS = ("gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur",
                     "zoom_blur", "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate",
                     "jpeg_compression")
SEVERITIES = (1, 2, 3, 4, 5)  # ImageNet-C's five levels


def _corruption_of(variant: str) -> str | None:
    """The corruption of ``<corruption>_<severity>[_s<seed>]``, else None."""
    base = variant.rsplit("_s", 1)[0] if variant.rsplit("_s", 1)[-1].isdigit() else variant
    name, _, sev = base.rpartition("_")
    return name if name in IMAGE_CORRUPTIONS and sev in {str(s) for s in SEVERITIES} else None


def is_corruption_variant(variant: str) -> bool:
    """``gaussian_noise_3_s0`` (or ``gaussian_noise_3``) is an ImageNet-C variant; ``mix_0.9_s1`` is not."""
    return _corruption_of(variant) is not None


def variant_hint(variant: str) -> str:
    """The command that writes an image variant folder ``variant`` (``<name>_s<seed>``)."""
    base, _, seed = variant.rpartition("_s")
    c = _corruption_of(variant)
    if c is not None:
        return f"hardrank perturb images --method corrupt:{c} --severity {base.rpartition('_')[2]} --seed {seed} ..."
    method, _, lam = base.partition("_")
    return f"hardrank perturb images --method {method} --lam {lam} --seed {seed} ..."


def variants_beside(images: str) -> str:
    """Where the variant folders of a folder of images go when they must not go inside it (an ImageFolder root,
    whose every subfolder torchvision and CLIP_benchmark count as a class): ``<images>-variants`` beside it."""
    return str(images).rstrip("/") + "-variants"

