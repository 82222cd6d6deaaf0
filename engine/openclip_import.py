"""open_clip imported without transformers, which it binds only for its Hugging Face text towers.

``import open_clip`` imports ``transformers`` whenever it is installed (``open_clip.hf_model`` and
``open_clip.coca_model`` bind its classes at import time): 1.7-1.9 s of a 6 s start-up on a 2-core CPU,
paid by every command although only open_clip models with a transformers text tower (xlm-roberta, mt5,
NLLB) use it. From ``import hardrank`` (which imports this module first, and not open_clip) until open_clip
is imported, a finder (``sys.meta_path``) hides transformers from the thread that imports open_clip while it
does, so open_clip binds its stand-ins; :func:`bind_transformers` gives ``open_clip.hf_model`` the real
classes when such a model is built (``models.hf_text``). transformers stays importable all along: another
thread's ``import transformers`` meanwhile gets the real module. A process that imported open_clip or
transformers before open_clip keeps them as they are.

hardrank takes transformers from :func:`import_transformers`, never from what an ``import transformers``
statement binds: its package replaces itself in ``sys.modules`` (a lazy module) at the end of its ``__init__``,
and a thread whose ``import transformers`` waits for another thread's first import of it gets the module
object it found before waiting, the empty shell (``module 'transformers' has no attribute
'AutoConfig'``). Two threads do first use it at once: a Ray actor decodes one batch (the image processor)
while it loads the model for another (issue 37).
"""
from __future__ import annotations

import contextlib
import sys
import threading

__all__ = ["import_transformers", "bind_transformers"]


class _OpenClipWithoutTransformers:
    """A finder (``sys.meta_path``, first): while a thread runs open_clip's first import, begun before
    transformers was imported, ``import transformers`` fails in that thread (and only there). It leaves
    ``sys.meta_path`` once open_clip is imported."""

    def __init__(self):
        self.thread: int | None = None  # the thread that began open_clip's import

    def find_spec(self, name, path=None, target=None):
        if name == "open_clip" and "transformers" not in sys.modules:
            self.thread = threading.get_ident()
        elif name == "transformers" and threading.get_ident() == self.thread and _importing("open_clip"):
            raise ModuleNotFoundError("transformers is hidden while open_clip is imported (hardrank.openclip_import)",
                                      name=name)
        elif "open_clip" in sys.modules and not _importing("open_clip"):
            with contextlib.suppress(ValueError):  # another thread's call removed it already
                sys.meta_path.remove(self)
        return None  # the finders after this one find every module


def _importing(name: str) -> bool:
    """Whether ``name``'s import has begun and not ended (the import system's own mark on its spec)."""
    module = sys.modules.get(name)
    return module is not None and bool(getattr(getattr(module, "__spec__", None), "_initializing", False))


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


if "open_clip" not in sys.modules and "transformers" not in sys.modules:  # at `import hardrank`: light
    sys.meta_path.insert(0, _OpenClipWithoutTransformers())
