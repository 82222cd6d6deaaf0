"""Encode stages: K checkpoints per batch, texts tokenised once per tokenizer and trimmed to length."""
from __future__ import annotations

import open_clip
import torch
from open_clip.transformer import text_global_pool

from hardrank.models.spec import LoadedModel

__all__ = ["ImageEncoder", "TextEncoder", "encode_text"]


class ImageEncoder:
    """Stage: pixels (a tensor, or a dict of a processor's arrays) -> one L2-normalised embedding array per
    model (``emb0``, ``emb1``...); an optional ``models`` entry of the batch (indices) limits it to those
    checkpoints."""

    def __init__(self, models: list[LoadedModel]):
        self.models = models

    @torch.inference_mode()
    def __call__(self, batch: dict) -> dict:
        out = dict(batch)
        for i in batch.get("models") or range(len(self.models)):  # "models": the checkpoints to run
            m = self.models[i]
            x = _to_device(batch["pixels"], m)
            emb = m.model.encode_image(x).float()
            out[f"emb{i}"] = torch.nn.functional.normalize(emb, dim=-1).cpu().numpy()
        return out


def _to_device(pixels, m: LoadedModel):
    """(B, 3, H, W) pixels on the model's device in its dtype; a processor's several arrays (a dict: SigLIP 2's
    patches, patch mask and grid) likewise, casting only the floating ones (masks and shapes keep theirs)."""
    if isinstance(pixels, dict):
        return {k: _to_device(v, m) if v.is_floating_point() else v.to(m.device, non_blocking=True)
                for k, v in pixels.items()}
    return pixels.to(m.device, non_blocking=True).to(m.dtype)


class TextEncoder:
    """Stage: ``{"text": [str]}`` -> embeddings per model. Texts are tokenised once per distinct
    tokenizer, not once per checkpoint, and each batch runs at its longest caption's length where
    that is exact (see ``encode_text``)."""

    def __init__(self, models: list[LoadedModel]):
        self.models = models

    def tokenize(self, texts: list[str], models=None) -> dict[tuple, torch.Tensor]:
        """The tokens of ``texts`` for each distinct tokenizer of ``models`` (indices; all when None). The
        in-process executor calls it in its prefetch thread, so batch i+1 tokenises (Python, under the GIL)
        while batch i encodes (torch, outside it); pass the result as the batch's ``tokens``."""
        out: dict[tuple, torch.Tensor] = {}
        for i in models or range(len(self.models)):
            tok = self.models[i].tokenizer
            tid = _tokenizer_key(tok)
            if tid not in out:
                out[tid] = tok(texts)
        return out

    @torch.inference_mode()
    def __call__(self, batch: dict) -> dict:
        out = dict(batch)
        models = batch.get("models") or range(len(self.models))  # "models": the checkpoints to run
        tokens_by_tok = batch.get("tokens") or self.tokenize(batch["text"], models)
        for i in models:
            m = self.models[i]
            tok = tokens_by_tok[_tokenizer_key(m.tokenizer)].to(m.device)
            emb = encode_text(m.model, tok).float()
            out[f"emb{i}"] = torch.nn.functional.normalize(emb, dim=-1).cpu().numpy()
        return out


def _tokenizer_key(tok) -> tuple:
    """Equal keys tokenise identically: each checkpoint gets its own tokenizer object, but K
    checkpoints of one architecture share the class, the context length and the vocabulary. A
    Hugging Face tokenizer's files are one folder, its caption cleaning and modes open_clip settings."""
    inner = getattr(tok, "tokenizer", None)
    return (type(tok).__module__, type(tok).__qualname__, getattr(tok, "context_length", None),
            getattr(inner, "name_or_path", None), len(getattr(tok, "encoder", ()) or ()),
            getattr(tok, "clean_fn", None), getattr(tok, "strip_sep_token", None), getattr(tok, "tokenizer_mode", None))


def _pool_index(model, tokens: torch.Tensor) -> torch.Tensor | None:
    """(B,) position each row's text embedding is pooled from, when cutting the padding is exact:
    an open_clip ``CLIP`` text tower with a causal mask (position i never sees j > i) and argmax/eos/
    first pooling. None otherwise (no causal mask, 'last' pooling, custom/HF towers)."""
    if not isinstance(model, open_clip.CLIP) or getattr(model, "attn_mask", None) is None:
        return None
    pool = model.text_pool_type
    if pool == "argmax":
        return tokens.argmax(dim=-1)
    if pool == "eos" and getattr(model, "text_eos_id", None) is not None:
        return (tokens == model.text_eos_id).int().argmax(dim=-1)
    if pool == "first":
        return torch.zeros(len(tokens), dtype=torch.long)
    return None


def encode_text(model, tokens: torch.Tensor) -> torch.Tensor:
    """``model.encode_text(tokens)`` run on ``tokens[:, :L]``, L = the batch's last pooled position + 1
    (its longest caption), where the tower allows it (``_pool_index``); equal to the full-length
    result up to float summation order. Falls back to ``model.encode_text`` otherwise."""
    pos = _pool_index(model, tokens) if len(tokens) else None
    if pos is None or int(pos.max()) + 1 >= tokens.shape[1]:
        return model.encode_text(tokens)
    n = int(pos.max()) + 1
    tokens = tokens[:, :n]  # (B, n)
    cast_dtype = model.transformer.get_cast_dtype()
    x = model.token_embedding(tokens).to(cast_dtype)  # (B, n, width): mirrors CLIP.encode_text
    x = x + model.positional_embedding[:n].to(cast_dtype)
    x = model.transformer(x, attn_mask=model.attn_mask[:n, :n])
    x = model.ln_final(x)
    x = text_global_pool(x, tokens, model.text_pool_type, eos_token_id=getattr(model, "text_eos_id", None))
    if model.text_projection is not None:
        proj = model.text_projection
        x = proj(x) if isinstance(proj, torch.nn.Linear) else x @ proj
    return x
