"""The item counts a run tells its user, each one explained: rows, distinct contents, duplicates, store hits."""
from __future__ import annotations

from hardrank.items import ItemTable

__all__ = ["item_counts", "embed_line"]


def item_counts(table: ItemTable) -> dict[str, int]:
    """``rows`` (distinct image paths / normalised captions), ``unreadable``, ``distinct`` (contents
    among the readable rows: one embedding each) and ``duplicates`` (readable rows whose content
    another row already has, e.g. the same JPEG under two names). Hashes images if not done yet."""
    keys = table.keys()
    good = [k for r, k in enumerate(keys) if k and r not in table.failed]
    distinct = len(set(good))
    return {"rows": len(keys), "unreadable": len(keys) - len(good), "distinct": distinct,
            "duplicates": len(good) - distinct}


def _rows(c: dict[str, int], noun: str) -> str:
    if c["duplicates"]:
        return (f"{c['rows']} {noun}s = {c['distinct']} distinct + {c['duplicates']} duplicates (same content "
                f"under another name, embedded once)")
    return f"{c['rows']} {noun}s"


def embed_line(modality: str, stats, table: ItemTable, checkpoints: int, labels=None) -> str:
    """One line per modality after embedding, e.g. ``images: 3596 images = 3279 distinct + 317
    duplicates (...); 3279 from the store, 0 encoded x 6 checkpoint(s), 0 failed (0.4s)``.
    ``stats``: the modality's ``EmbedStats``. When the checkpoints found different rows in the store
    (one was evaluated before, another is new), the line names each: ``per checkpoint, from the store +
    encoded: step0700 3279 + 0, step0800 0 + 3279``; ``labels`` names them."""
    c = item_counts(table)
    noun = "caption" if modality == "text" else modality
    per = list(getattr(stats, "per_checkpoint", None) or [])
    tail = f"{stats.failed} failed ({stats.seconds:.1f}s)"
    if checkpoints > 1 and len(per) == checkpoints and len({(p["from_store"], p["encoded"]) for p in per}) > 1:
        names = list(labels) if labels is not None and len(labels) == checkpoints else [
            f"#{i}" for i in range(checkpoints)]
        each = ", ".join(f"{n} {p['from_store']} + {p['encoded']}" for n, p in zip(names, per))
        return f"{modality}s: {_rows(c, noun)}; per checkpoint, from the store + encoded: {each}; {tail}"
    hits = max(c["distinct"] - stats.encoded, 0)
    return (f"{modality}s: {_rows(c, noun)}; {hits} from the store, {stats.encoded} encoded x {checkpoints} "
            f"checkpoint(s), {tail}")
