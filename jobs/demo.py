"""The demo job's inputs: the bundled toy model config, its checkpoints, and the toy world."""
from __future__ import annotations

from hardrank.config import DATA_DIR as DATA

__all__ = ["demo_inputs"]


def demo_inputs(world: str) -> tuple[str, tuple[str, ...], str]:
    """(model config, checkpoints in step order, world folder built if absent)."""
    from hardrank.toyworld import build_world

    ckpts = tuple(str(p) for p in sorted((DATA / "toy_checkpoints").glob("*.safetensors")))
    if not ckpts:
        raise FileNotFoundError(f"no toy checkpoints in {DATA / 'toy_checkpoints'}; run `make toy-checkpoints`")
    return str(DATA / "models" / "toy-clip.json"), ckpts, str(build_world(world))
