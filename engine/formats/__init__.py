"""File formats several rooms read (the lowest room above the core: suites, inputs, perturb, scoring and toyworld
import it, it imports none of them): annotations.py (JSON / JSON Lines readers whose errors name the file and the
item), karpathy.py (the Karpathy JSON and RoCOCO's variant files), xm3600.py (Crossmodal-3600's captions.jsonl),
variants.py (the variant names and kinds: RoCOCO's text variants, image variant folders, ImageNet-C's corruptions),
masks.py (COCO RLE masks and the amodal predictions' format)."""
