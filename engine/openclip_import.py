"""open_clip imported without transformers, which it binds only for its Hugging Face text towers.

``import open_clip`` imports ``transformers`` whenever it is installed (``open_clip.hf_model`` and
``open_clip.coca_model`` bind its classes at import time): 1.7-1.9 s of a 6 s start-up on a 2-core CPU,
paid by every command although only open_clip models with a transformers text tower (xlm-roberta, mt5,
NLLB) use it. ``hardrank`` imports open_clip first (here, from ``hardrank/__init__``) with transformers
hidden, so open_clip binds its stand-ins, and :func:`bind_transformers` gives ``open_clip.hf_model`` the
real classes when such a model is built (``models.hf_text``). transformers stays importable all along:
the hiding lasts the one ``import open_clip`` statement, in the thread that runs it (another thread's
``import transformers`` meanwhile gets the real module). A process that imported open_clip or
transformers before hardrank keeps them as they are.

hardrank takes transformers from :func:`import_transformers`, never from what an ``import transformers``
statement binds: its package replaces itself in ``sys.modules`` (a lazy module) at the end of its ``__init__``,
and a thread whose ``import transformers`` waits for another thread's first import of it gets the module
object it found before waiting, the empty shell (``module 'transformers' has no attribute
'AutoConfig'``). Two threads do first use it at once: a Ray actor decodes one batch (the image processor)
while it loads the model for another (issue 37).
"""
from __future__ import annotations

import sys
import threading

__all__ = ["import_open_clip", "import_transformers", "bind_transformers"]


class _HideTransformers:
    """A finder (``sys.meta_path``): ``import transformers`` fails in the thread that created it, and only there."""

    def __init__(self):
        self.thread = threading.get_ident()

    def find_spec(self, name, path=None, target=None):
        if name == "transformers" and threading.get_ident() == self.thread:
            raise ModuleNotFoundError("transformers is hidden while hardrank imports open_clip", name=name)
        return None  # any other module, or another thread: the finders after this one


def import_open_clip() -> None:
    """Import open_clip with ``transformers`` hidden from this thread (once; nothing if either is already
    imported)."""
    if "open_clip" in sys.modules or "transformers" in sys.modules:
        return
    hide = _HideTransformers()
    sys.meta_path.insert(0, hide)
    try:
        import open_clip  # noqa: F401
    finally:
        sys.meta_path.remove(hide)


def import_transformers():
    """The ``transformers`` module, whole (raises ImportError without it): what ``sys.modules`` holds once
    the ``import`` statement has returned (it waits for another thread's import to end, but returns the
    module object it found before waiting: see the module's docstring). Once this returned, ``from
    transformers import X`` in this thread is safe too."""
    import transformers  # noqa: F401
    return sys.modules["transformers"]


def bind_transformers() -> None:
    """Give ``open_clip.hf_model`` the transformers classes it would have bound at import (call before
    building an open_clip model with a transformers text tower; raises ImportError without transformers)."""
    transformers = import_transformers()
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
