"""Mining inputs: corpus and queries opened through the input registry, embedded, compiled into a problem."""
from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import numpy as np

from hardrank import urls
from hardrank.config import DIRECTIONS, MineConfig
from hardrank.embed import EmbedPipeline
from hardrank.errors import DataError, UsageError
from hardrank.inputs import registry
from hardrank.inputs.kind import Embeddings, InputOptions, Items, Source
from hardrank.inputs.kinds.image_folder import IMAGE_EXTENSIONS
from hardrank.items import ItemTable, Tables, text_key
from hardrank.mining.catalog import MAPPED_ROWS, Catalog
from hardrank.mining.problem import MineProblem, StoreRows
from hardrank.mining.training_table import check_training_inputs
from hardrank.models.runs import user_specs
from hardrank.scoring.counts import embed_line
from hardrank.settings import RunSettings
from hardrank.store.embedding_store import EmbeddingStore

__all__ = ["build_problem", "IMAGE_EXTENSIONS"]


def _content_id(emb) -> str:
    """What identifies an embeddings input's content: its files' identity where that differs from the model's
    (an export names its model; its content_id, its file)."""
    return getattr(emb, "content_id", "") or emb.fingerprint


def _pipeline(cfg: MineConfig, sources: list[Source], echo, runner,
              settings: RunSettings | None) -> tuple[EmbedPipeline | None, EmbeddingStore | Embeddings, str]:
    """(the model's embed pipeline or None, the store new embeddings go to; without a model, the
    inputs' own embeddings, which name the model that made them; why the corpus and queries compare).

    Inputs whose fingerprints name different models (store folders, exports carrying their model) are
    refused: their vectors are known not to compare. Files that name no model (a user's Parquet, a
    clip-retrieval folder) are taken at the user's word, which the summary records; only a difference
    in dimension is refused for them (``_check_dims``)."""
    stores = [s.embeddings for s in sources if s.embeddings is not None]
    named = {s.fingerprint for s in stores if s.names_model}
    if cfg.model is None:
        todo = next((s for s in sources if s.embeddings is None), None)
        if todo is not None:
            raise UsageError(f"embedding the items of {todo.path} ({todo.kind}) needs --model (and --checkpoint); "
                             f"without a model, pass inputs holding embeddings for both: "
                             f"{registry.describe('embeddings')}")
        if len(named) > 1:
            raise UsageError(f"corpus and queries come from different models' stores {sorted(named)}; their "
                             f"embeddings are not comparable: embed both with one model (a store folder and an "
                             f"export are named by the model that made them)")
        fps = {s.fingerprint for s in stores}
        if len(fps) == 1:
            why = f"one model: {stores[0].fingerprint}" if stores[0].names_model else "one source"
        else:
            why = "user's claim: different sources (" + ", ".join(f"{s.dir}: {s.fingerprint}" for s in stores) + ")"
        return None, stores[0], why
    e = cfg.embed
    pipe = EmbedPipeline(user_specs(cfg.model, (cfg.checkpoint,), precision=e.precision, device=e.device,
                                    pretrained=cfg.pretrained, random_init=cfg.random_init), e, runner=runner,
                         settings=settings)
    for s in stores:
        if s.names_model and s.fingerprint != pipe.fingerprint(0):
            raise UsageError(f"{s.dir} holds embeddings of {s.fingerprint}, but --model/--checkpoint "
                             f"give {pipe.fingerprint(0)}; pass the matching model or embeddings of this model")
    m = pipe.models[0]
    echo(f"model {m.arch_name} ({pipe.fingerprint(0)}) on {m.device}")
    unnamed = [s for s in stores if not s.names_model]
    why = (f"one model: {pipe.fingerprint(0)}" if not unnamed else
           "user's claim: " + ", ".join(str(s.dir) for s in unnamed) + f" embedded by {pipe.fingerprint(0)}")
    return pipe, pipe.stores[0], why


def _check_dims(corpus: Source, queries: Source, dc: int, dq: int) -> None:
    """Corpus and query vectors of different dimensions cannot be scored against each other."""
    if dc != dq:
        raise UsageError(f"corpus {corpus.path} holds {dc}-d embeddings but queries {queries.path} hold {dq}-d; "
                         f"embeddings compared must come from one model (or models sharing one embedding space) "
                         f"and have one dimension")


def _karpathy_groups(src: Source, tables: Tables, rows: dict) -> None:
    """Name each Karpathy group by its image's content key (so a corpus from another file or an image
    folder matches), or by its image path when images are not given or unreadable."""
    img = src.items.get("image")
    if img is not None and img.keys is None:
        if (id(src), "image") in rows:
            all_keys = tables.images.keys()
            img.keys = [all_keys[r] if r not in tables.images.failed else "" for r in rows[(id(src), "image")]]
        else:  # images not embedded in this run (t2t): hash them for their keys only
            t = ItemTable("image")
            for e, k in zip(img.entries, img.known or [None] * len(img.entries)):
                t.add(e, None, k)
            img.keys = t.keys()
    keys = img.keys if img is not None else [""] * len(src.group_names)
    group_key = [k or f"path:{p}" for k, p in zip(keys, src.group_names)]
    for it in src.items.values():
        it.group_key = [group_key[g] for g in it.group]


def _rebase_image_ids(cfg: MineConfig, sources: list[Source]) -> str | None:
    """Name every image whose id is its file path (Karpathy files, folders) by its path relative to one
    root: --images when it holds them all, else their deepest common folder. Returns the root (None: no
    such images)."""
    its = [s.items["image"] for s in sources if s.path_ids and "image" in s.items]
    its = [it for it in its if not any(urls.is_url(ref.uri) for ref in it.entries)]  # URLs keep their ids
    paths = [os.path.abspath(ref.uri) for it in its for ref in it.entries]
    if not paths:
        return None
    root = os.path.abspath(cfg.images) if cfg.images else None
    if root is None or any(os.path.commonpath([root, p]) != root for p in paths):
        root = os.path.commonpath([os.path.dirname(p) for p in paths])
    for it in its:
        it.ids = [Path(os.path.relpath(os.path.abspath(ref.uri), root)).as_posix() for ref in it.entries]
    return root


def _pairs(sources: list[Source]) -> list[tuple[str, str, str, str]]:
    """(image path, image key, caption as written, caption key) of every (image file, caption) pair among
    the inputs (Karpathy files), the queries' first: the rows of a NegCLIP training file."""
    out, seen = [], set()
    for src in sources:
        img, txt = src.items.get("image"), src.items.get("text")
        if not (src.paired and src.path_ids) or img is None or txt is None or img.keys is None:
            continue
        for i, g in enumerate(txt.group):
            ikey, ckey = img.keys[int(g)], text_key(txt.entries[i])
            if ikey and (ikey, ckey) not in seen:
                seen.add((ikey, ckey))
                out.append((os.path.abspath(img.entries[int(g)].uri), ikey, txt.ids[i], ckey))
    return out


def build_problem(cfg: MineConfig, *, progress=None, echo=None, runner=None, lazy_corpus: bool = False,
                  ids_dir: Path | None = None, ids_mapped: bool = False, ids_reuse: Path | None = None,
                  settings: RunSettings | None = None) -> MineProblem:
    """Load both inputs, embed what the store lacks, and compile queries, corpus and positives.

    Positives of a query (in the corpus modality) are the items of its own source in its group: for
    a Karpathy file, a caption's image or an image's captions (t2t: every caption of the image, i2i:
    the image); elsewhere, the item itself in same-modal mining and none across modalities. Corpus
    rows are never returned for a query when their content key is a positive's, or their group
    (Karpathy image, keyed by image content when --images is given) is the query's. Duplicate query
    ids are merged, their positives united. ``settings``: the mining run's threads (None: the embedding is a
    run of its own, its threads from ``cfg.embed``)."""
    echo = echo or (lambda s: None)
    qmod, cmod = DIRECTIONS[cfg.direction]
    opts = InputOptions(images=cfg.images, captions=cfg.captions)
    csrc = registry.open_input(cfg.corpus, opts)
    same = cfg.queries == cfg.corpus or os.path.abspath(cfg.queries) == os.path.abspath(cfg.corpus)
    qsrc = csrc if same else registry.open_input(cfg.queries, opts)
    for src, mod, role in ((csrc, cmod, "corpus"), (qsrc, qmod, "queries")):
        if mod not in src.items:
            hint = f" ({src.hint})" if src.hint else ""
            raise UsageError(f"{role} {src.path} ({src.kind}) has no {mod}s, which direction {cfg.direction} "
                             f"needs{hint}; it has {sorted(src.items) or 'nothing'}")
        if not len(src.items[mod].ids):
            raise DataError(f"{role} {src.path} ({src.kind}) holds no {mod}s: it is empty; pass a {role} input "
                            f"with at least one {mod}")
    if qsrc.group_names is not None and cmod not in qsrc.items:
        raise UsageError(f"queries {qsrc.path}: pass --images so each caption's image (its positive, to be "
                         f"excluded) is known")
    if cfg.export_training:  # before anything is embedded: pairs come from Karpathy files with their images
        check_training_inputs(cfg.export_training, any(s.paired and s.path_ids and {"image", "text"} <= set(s.items)
                                                       for s in (csrc, qsrc)))
    pipe, store, compatibility = _pipeline(cfg, [csrc, qsrc], echo, runner, settings)
    sources = list({id(x): x for x in (qsrc, csrc)}.values())
    image_root = _rebase_image_ids(cfg, sources)
    if image_root is not None:
        echo(f"image ids: paths relative to {image_root}")
    pos_items = qsrc.items.get(cmod)
    needed = [(csrc, cmod), (qsrc, qmod)] + ([(qsrc, cmod)] if pos_items is not None else [])
    tables = Tables.empty()
    rows: dict[tuple[int, str], np.ndarray] = {}
    for src, mod in needed:
        it = src.items[mod]
        if it.entries is not None and (id(src), mod) not in rows:
            known = it.known or [None] * len(it.entries)
            t = tables.of(mod)
            rows[(id(src), mod)] = np.array([t.add(e, i, k) for e, i, k in zip(it.entries, it.ids, known)],
                                            dtype=np.int64)
    embed = {}
    if pipe is not None and (len(tables.images) or len(tables.texts)):
        stats = pipe.run(tables, progress=progress)
        embed = {k: v.as_dict() for k, v in stats.items()}
        for mod, st in stats.items():
            if st.total:
                echo(embed_line(mod, st, tables.of(mod), 1))
    for src, mod in needed:
        it = src.items[mod]
        if it.keys is None:
            table = tables.of(mod)
            all_keys = table.keys()
            it.keys = [all_keys[r] if r not in table.failed else "" for r in rows[(id(src), mod)]]

    for src in {id(s): s for s in (csrc, qsrc)}.values():
        if src.group_names is not None:
            _karpathy_groups(src, tables, rows)

    def read(src: Source, mod: str, sel, lazy: bool = False):
        """Rows ``sel`` of the input's ``mod`` items. ``lazy``: shard actors read their own slices."""
        if src.embeddings is not None:  # the input reads its own vectors (a lazy view where it can)
            return src.embeddings.read(mod, sel, lazy=lazy)
        keys = [src.items[mod].keys[i] for i in sel]
        return StoreRows.of(store, mod, keys) if lazy else store.read(mod, keys)

    def reread(src: Source, mod: str, sel):
        """Rows ``sel`` read again from the input's files on each access (None: ``read`` reads them as stored)."""
        return src.embeddings.reread(mod, sel) if src.embeddings is not None else None

    def gkey(it: Items, i: int) -> str:
        return it.group_key[i] if it.group_key is not None else it.keys[i]

    # corpus
    cit = csrc.items[cmod]
    catalog = None
    if csrc.embeddings is not None:  # its ids and keys as Arrow columns (memory-mapped when large)
        n = len(cit.ids)
        source = {"fingerprint": _content_id(csrc.embeddings), "modality": cmod, "paired": bool(csrc.paired)}
        where = ids_dir if ids_dir is not None and (ids_mapped or n >= MAPPED_ROWS) else None
        catalog = Catalog.of_chunks(csrc.embeddings.columns(cmod, paired=csrc.paired), where, source, ids_reuse)
        c_rows = range(len(catalog))
        if where is not None:
            echo(f"corpus ids: {len(catalog):,} rows, memory-mapped from {catalog.path}")
    else:
        c_rows = [i for i, k in enumerate(cit.keys) if k]
        by_key: dict[str, list[int]] = {}
        for j, i in enumerate(c_rows):
            by_key.setdefault(cit.keys[i], []).append(j)
            g = gkey(cit, i)
            if g != cit.keys[i]:
                by_key.setdefault(g, []).append(j)
    xb = read(csrc, cmod, c_rows, lazy=lazy_corpus)
    # queries, merged by id; positives = same-group items of the query source, in the corpus modality
    qit = qsrc.items[qmod]
    members: dict[int, list[int]] = {}
    if pos_items is not None:
        for i, g in enumerate(pos_items.group):
            if pos_items.keys[i]:
                members.setdefault(int(g), []).append(i)
    order: dict[str, int] = {}
    q_rows, q_pos, q_excl = [], [], []
    for i, k in enumerate(qit.keys):
        if not k:
            continue
        pos = members.get(int(qit.group[i]), []) if pos_items is not None else []
        if not qsrc.paired and qmod != cmod:
            pos = []  # no grouping across modalities outside inputs that pair them (Karpathy, shards, clip-retrieval)
        keys = {pos_items.keys[p] for p in pos} | {gkey(qit, i), k}
        j = order.setdefault(qit.ids[i], len(q_rows))
        if j == len(q_rows):
            q_rows.append(i)
            q_pos.append(list(pos))
            q_excl.append(keys)
        else:
            q_pos[j] = sorted(set(q_pos[j]) | set(pos))
            q_excl[j] |= keys
    if q_rows and len(xb):  # before the queries are read: a mismatch is named without reading them all
        _check_dims(csrc, qsrc, xb.shape[1], read(qsrc, qmod, q_rows[:1]).shape[1])
    xq = read(qsrc, qmod, q_rows)  # kept in its dtype (fp16 from an fp16 store): blocks are made float32
    if catalog is not None:  # the queries' few keys looked up in the corpus's columns
        by_key = catalog.rows_with(set().union(*q_excl) if q_excl else set())
    excl = [sorted({r for key in keys for r in by_key.get(key, ())}) for keys in q_excl]
    exclude_ptr = np.zeros(len(q_rows) + 1, np.int64)
    np.cumsum([len(e) for e in excl], out=exclude_ptr[1:])
    pos_ptr = np.zeros(len(q_rows) + 1, np.int64)
    np.cumsum([len(p) for p in q_pos], out=pos_ptr[1:])
    flat_pos = [p for ps in q_pos for p in ps]
    if pos_items is not None and flat_pos and qsrc.embeddings is not None:
        pos_emb = read(qsrc, cmod, flat_pos)  # the input's own reader (lazy for clip-retrieval, like the corpus)
    elif pos_items is not None and flat_pos:
        uniq, inv = np.unique(flat_pos, return_inverse=True)
        pos_emb = read(qsrc, cmod, uniq.tolist())[inv]
    else:
        pos_emb = np.zeros((0, xb.shape[1]), np.float32)
    fp = store.fingerprint
    ids = {"image_root": image_root, "images": "path relative to image_root (Karpathy files, folders); a "
           "listing's or embeddings file's own id", "texts": "the caption as written (a listing's own id)",
           "keys": "query_key / negative_key: content keys (store folders name items by these alone)"}
    meta = {"ids": ids, "corpus": {"path": cfg.corpus, "kind": csrc.kind, "rows": len(c_rows),
                       "skipped": len(cit.keys) - len(c_rows),
                       "fingerprint": _content_id(csrc.embeddings) if csrc.embeddings is not None else None,
                       "ids": ("memory-mapped: " + str(catalog.path)) if catalog is not None and catalog.mapped
                       else "in memory", "ids_digest": catalog.ids_digest if catalog is not None else None},
            "queries": {"path": cfg.queries, "kind": qsrc.kind, "rows": len(q_rows),
                        "skipped": sum(1 for k in qit.keys if not k)},
            "model_fingerprint": fp, "compatibility": compatibility, "embed": embed}
    problem = MineProblem(
        xq=xq, xb=xb, query_ids=[qit.ids[i] for i in q_rows],
        corpus_ids=catalog.ids if catalog is not None else [cit.ids[i] for i in c_rows],
        modality=cmod, direction=cfg.direction,
        exclude_ptr=exclude_ptr, exclude_idx=np.array([r for e in excl for r in e], np.int64),
        pos_ptr=pos_ptr, pos_emb=pos_emb,
        pos_ids=[[pos_items.ids[p] for p in ps] for ps in q_pos] if pos_items is not None else None,
        query_keys=[qit.keys[i] for i in q_rows],
        corpus_keys=catalog.keys if catalog is not None else [cit.keys[i] for i in c_rows],
        pairs=_pairs(sources), meta=meta)
    ref = {"xb": reread(csrc, cmod, c_rows), "xq": reread(qsrc, qmod, q_rows),
           "pos_emb": reread(qsrc, cmod, flat_pos) if pos_items is not None and flat_pos else None}
    ref = {name: r for name, r in ref.items() if r is not None}
    if ref:
        problem.reference = dataclasses.replace(problem, **ref)
    return problem
