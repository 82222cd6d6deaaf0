"""Perturbations: RoCOCO-style text and image variants, adversarial variants, and their WebDataset shards."""
from hardrank.perturb.images import alter_images, variant_name
from hardrank.perturb.texts import perturb_captions, write_variant_file

__all__ = ["alter_images", "variant_name", "perturb_captions", "write_variant_file"]
