"""Perturbations: RoCOCO-style text and image variants, adversarial variants, and their WebDataset shards.

The commands' entry points: ``perturb_texts`` / ``perturb_images`` (here), ``attack_texts`` /
``attack_images`` (``hardrank.attack_run``, which evaluates, so it is not imported here: the
suites this package's shards feed would import it back)."""
from hardrank.perturb.images import alter_images, variant_name
from hardrank.perturb.run import PerturbImagesConfig, PerturbTextsConfig, perturb_images, perturb_texts
from hardrank.perturb.texts import perturb_captions, write_variant_file

__all__ = ["alter_images", "variant_name", "perturb_captions", "write_variant_file", "PerturbTextsConfig",
           "PerturbImagesConfig", "perturb_texts", "perturb_images"]
