"""open_clip imported without transformers, which it binds only for its Hugging Face text towers.

``import open_clip`` imports ``transformers`` whenever it is installed (``open_clip.hf_model`` and
``open_clip.coca_model`` bind its classes at import time): 1.7-1.9 s of a 6 s start-up on a 2-core CPU,
paid by every command although only open_clip models with a transformers text tower (xlm-roberta, mt5,
NLLB) use it. ``hardrank`` imports open_clip first (here, from ``hardrank/__init__``) with transformers
hidden, so open_clip binds its stand-ins, and :func:`bind_transformers` gives ``open_clip.hf_model`` the
real classes when such a model is built (``models.hf_text``). transformers stays importable all along:
the hiding lasts the one ``import open_clip`` statement. A process that imported open_clip or
transformers before hardrank keeps them as they are.
"""
from __future__ import annotations

import sys

__all__ = ["import_open_clip", "bind_transformers"]


def import_open_clip() -> None:
    """Import open_clip with ``transformers`` hidden (once; nothing if either is already imported)."""
    if "open_clip" in sys.modules or "transformers" in sys.modules:
        return
    sys.modules["transformers"] = None  # type: ignore[assignment]  # `import transformers` raises ImportError
    try:
        import open_clip  # noqa: F401
    finally:
        if sys.modules.get("transformers", 0) is None:
            del sys.modules["transformers"]


def bind_transformers() -> None:
    """Give ``open_clip.hf_model`` the transformers classes it would have bound at import (call before
    building an open_clip model with a transformers text tower; raises ImportError without transformers)."""
    import transformers
    from open_clip import hf_model
    if hf_model.transformers is not None:
        return
    from transformers import AutoConfig, AutoModel, AutoTokenizer, PretrainedConfig
    from transformers.modeling_outputs import (
        BaseModelOutput,
        BaseModelOutputWithPooling,
        BaseModelOutputWithPoolingAndCrossAttentions,
    )
    for name, value in (("AutoConfig", AutoConfig), ("AutoModel", AutoModel), ("AutoTokenizer", AutoTokenizer),
                        ("PretrainedConfig", PretrainedConfig), ("BaseModelOutput", BaseModelOutput),
                        ("BaseModelOutputWithPooling", BaseModelOutputWithPooling),
                        ("BaseModelOutputWithPoolingAndCrossAttentions",
                         BaseModelOutputWithPoolingAndCrossAttentions)):
        setattr(hf_model, name, value)
    hf_model.transformers = transformers


import_open_clip()  # at import: `hardrank/__init__` imports this module before any module that imports open_clip
