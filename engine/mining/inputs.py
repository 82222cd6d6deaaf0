"""Mining inputs: Karpathy JSON, image folder, Parquet listing, store or clip-retrieval folder -> vectors, positives."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from hardrank import urls
from hardrank.config import DIRECTIONS, MineConfig
from hardrank.embed import EmbedPipeline
from hardrank.errors import DataError, UsageError
from hardrank.inputs import is_sample_source, parse_captions, read_samples, sample_captions
from hardrank.inputs.clip_retrieval import KINDS as CLIP_RETRIEVAL_KINDS
from hardrank.inputs.clip_retrieval import ClipRetrievalFolder, is_clip_retrieval_folder
from hardrank.inputs.embedding_files import load_embedding_file
from hardrank.items import ImageRef, ItemTable, Tables, text_key
from hardrank.mining.problem import MineProblem, StoreRows
from hardrank.models.openclip import ModelSpec, file_hash
from hardrank.scoring.counts import embed_line
from hardrank.store.embedding_store import EmbeddingStore, is_store_folder, open_store
from hardrank.suites.karpathy import read_karpathy
from hardrank.text import pre_caption

__all__ = ["build_problem", "IMAGE_EXTENSIONS"]

IMAGE_EXTENSIONS = {".jpg", ".jpeg", ".png", ".bmp", ".webp", ".gif", ".tif", ".tiff"}


@dataclass
class _Items:
    """Items of one modality of one source. Items sharing ``group`` are each other's positives
    (Karpathy: an image and its captions); ``group_key`` names the group across sources."""

    ids: list[str]
    entries: list | None      # ImageRef / normalised caption; None for store sources (keys given)
    group: np.ndarray         # (n,) int64
    group_key: list[str] | None = None  # None: the item's own content key
    keys: list[str] | None = None       # content keys ("" = unreadable), filled by build_problem
    known: list[str | None] | None = None  # content keys a reader computed already (a tar shard's scan)


@dataclass
class _MineInput:
    kind: str                 # karpathy | folder | parquet | embeddings | store | clip_retrieval
    path: str
    items: dict[str, _Items]
    store: EmbeddingStore | None = None
    group_names: list[str] | None = None  # Karpathy: image path of each group


class _FileEmbeddings:
    """An exported (``hardrank store export``) or bring-your-own embeddings file, read like a store
    folder: embeddings by content key. Files without a ``key`` column key captions by their
    normalised text (as the store does) and images by their id."""

    def __init__(self, path: Path):
        data = load_embedding_file(path)
        t = pq.read_table(path)
        self.dir, self.dim = path, next(iter(data.values()))[1].shape[1] if data else 0
        meta = json.loads((t.schema.metadata or {}).get(b"hardrank_export", b"{}") or b"{}")
        self.fingerprint = meta.get("fingerprint") or f"embeddings-{file_hash(path)[:16]}"
        kinds = t.column("kind").to_pylist()
        file_keys = t.column("key").to_pylist() if "key" in t.column_names else None
        self.ids, self.keys, self._rows, self._emb = {}, {}, {}, {}
        for mod, (ids, emb) in data.items():
            if file_keys is not None:
                keys = [k for k, kind in zip(file_keys, kinds) if kind == mod]
            else:
                keys = [text_key(pre_caption(i)) if mod == "text" else f"id:{i}" for i in ids]
            self.ids[mod], self.keys[mod], self._emb[mod] = ids, keys, emb
            self._rows[mod] = {}
            for r, k in enumerate(keys):
                self._rows[mod].setdefault(k, r)

    def read(self, modality: str, keys: list[str]) -> np.ndarray:
        """(N, d) float32 embeddings of ``keys``."""
        rows = self._rows[modality]
        return self._emb[modality][np.fromiter((rows[k] for k in keys), dtype=np.int64, count=len(keys))]


def _source_error(path, what: str) -> DataError:
    return DataError(f"{path}: {what}. A corpus or query set is a Karpathy-format .json (with --images), an "
                      f"image folder, a .parquet listing with columns id + path (images) or id + text, an "
                      f"embeddings .parquet (kind, id, embedding: `hardrank store export` writes one), an "
                      f"embedding store fingerprint folder (holding manifest.json), or a clip-retrieval output "
                      f"folder (img_emb/, text_emb/, metadata/)")


def _sample_source(path: str, captions: str) -> _MineInput:
    """Tar shards or img2dataset outputs: each sample's image and its captions, positives of each other
    (like a Karpathy file's image and captions); ids are the samples' (``<shard>#<key>``)."""
    how = parse_captions(captions)
    ss = read_samples(path)
    ids, refs, known, caps, owner = [], [], [], [], []
    for s in ss.samples:
        if s.image is None:
            continue
        g = len(ids)
        ids.append(s.id)
        refs.append(ImageRef(s.image))
        known.append(s.image_key)
        for c in sample_captions(s, how):
            caps.append(c)
            owner.append(g)
    if not ids:
        raise _source_error(path, f"holds {len(ss.samples)} sample(s), none with an image")
    items = {"image": _Items(ids, refs, np.arange(len(ids)), known=known)}
    if caps:
        items["text"] = _Items(caps, [pre_caption(c) for c in caps], np.array(owner, dtype=np.int64))
    return _MineInput("wds", path, items, group_names=ids)


_EMB_FOLDERS = tuple(folder for folder, _, _ in CLIP_RETRIEVAL_KINDS.values())  # img_emb, text_emb


def _load_source(path: str, images: str | None, captions: str = "txt") -> _MineInput:
    if is_sample_source(path):
        return _sample_source(path, captions)
    if urls.is_url(path):
        if urls.is_dir(path) and not any(urls.exists(urls.join(path, m)) for m in ("manifest.json", *_EMB_FOLDERS)):
            return _remote_folder(path)
        path = urls.fetch_input(path, what="input")  # a file, a store or clip-retrieval folder: a local copy
    p = Path(path)
    if is_store_folder(p):
        store = open_store(p)
        bad = sum(store.verify(mod) for mod in ("image", "text"))  # read in full below: check it all now
        if bad:
            raise DataError(f"{p}: {bad} shard(s) of this store folder failed their checksum (named above), so "
                            f"their embeddings cannot be trusted; re-embed the items with --model/--checkpoint "
                            f"(eval or mine quarantine and re-encode them), or pass an intact copy of the store")
        items = {}
        for mod in ("image", "text"):
            keys = store.keys(mod)
            if keys:
                items[mod] = _Items(ids=keys, entries=None, group=np.arange(len(keys)), keys=keys)
        return _MineInput("store", path, items, store)
    if is_clip_retrieval_folder(p):
        return _clip_retrieval_source(p)
    if p.is_dir():
        files = sorted(f for f in p.rglob("*") if f.suffix.lower() in IMAGE_EXTENSIONS and f.is_file())
        if not files:
            raise _source_error(p, f"folder holds no images ({', '.join(sorted(IMAGE_EXTENSIONS))})")
        ids = [f.relative_to(p).as_posix() for f in files]
        return _MineInput("folder", path, {"image": _Items(ids, [ImageRef(os.fspath(f)) for f in files],
                                                        np.arange(len(files)))})
    if not p.is_file():
        raise FileNotFoundError(f"{p} does not exist")
    if p.suffix == ".json":
        clean = read_karpathy(p)
        owner = np.repeat(np.arange(len(clean)), [len(c) for _, c in clean])
        caps = [c for _, cs in clean for c in cs]
        items = {"text": _Items(caps, [pre_caption(c) for c in caps], owner)}
        paths = [im for im, _ in clean]
        if images is not None:
            items["image"] = _Items(paths, [ImageRef(urls.join(images, im)) for im in paths],
                                    np.arange(len(clean)))
        return _MineInput("karpathy", path, items, group_names=paths)
    if p.suffix == ".parquet":
        try:
            cols = pq.read_schema(p).names
        except (pa.ArrowException, OSError) as exc:
            raise _source_error(p, f"not a readable Parquet file ({exc})") from None
        if {"kind", "id", "embedding"} <= set(cols):  # an embeddings file: ids and embeddings, no model needed
            emb = _FileEmbeddings(p)
            items = {mod: _Items(ids=list(emb.ids[mod]), entries=None, group=np.arange(len(emb.ids[mod])),
                                 keys=list(emb.keys[mod])) for mod in emb.ids}
            return _MineInput("embeddings", path, items, emb)
        if "id" not in cols or ("path" in cols) == ("text" in cols):
            raise _source_error(p, f"listing has columns {cols}; expected 'id' and one of 'path' or 'text'")
        t = pq.read_table(p, columns=["id", "path" if "path" in cols else "text"])
        ids = [str(v) for v in t.column("id").to_pylist()]
        if "text" in cols:
            texts = t.column("text").to_pylist()
            return _MineInput("parquet", path,
                              {"text": _Items(ids, [pre_caption(x) for x in texts], np.arange(len(ids)))})
        root = Path(images) if images is not None else p.parent
        refs = [ImageRef(os.fspath(root / x)) for x in t.column("path").to_pylist()]
        return _MineInput("parquet", path, {"image": _Items(ids, refs, np.arange(len(ids)))})
    raise _source_error(p, f"unrecognised input (suffix {p.suffix!r})")


def _remote_folder(url: str) -> _MineInput:
    """An image folder behind a URL: listed, its images read by the workers that decode them."""
    files = [f for f in urls.list_files(url) if os.path.splitext(f)[1].lower() in IMAGE_EXTENSIONS]
    if not files:
        raise _source_error(url, f"folder holds no images ({', '.join(sorted(IMAGE_EXTENSIONS))})")
    root = url.rstrip("/") + "/"
    ids = [f[len(root):] if f.startswith(root) else f for f in files]
    return _MineInput("folder", url, {"image": _Items(ids, [ImageRef(f) for f in files], np.arange(len(files)))})


def _clip_retrieval_source(p: Path) -> _MineInput:
    """A clip-retrieval folder: ids from its metadata (image_path, caption), vectors read lazily from
    its .npy parts. Row i's image and caption are one sample, so they are each other's positives (as
    a Karpathy image and its captions are): the group of both is the image's key."""
    cr = ClipRetrievalFolder(p)
    items: dict[str, _Items] = {}
    for mod in cr.kinds:
        ids = cr.ids(mod)
        keys = [text_key(pre_caption(i)) for i in ids] if mod == "text" else [f"id:{i}" for i in ids]
        items[mod] = _Items(ids=ids, entries=None, group=np.arange(len(ids)), keys=keys)
    if "image" in items:
        for it in items.values():
            it.group_key = items["image"].keys
    return _MineInput("clip_retrieval", str(p), items, cr)


def _pipeline(cfg: MineConfig, sources: list[_MineInput], echo, runner) -> tuple[EmbedPipeline | None, EmbeddingStore]:
    """(the model's embed pipeline or None, the store new embeddings go to)."""
    stores = [s.store for s in sources if s.store is not None]
    if cfg.model is None:
        if any(s.store is None for s in sources):
            raise UsageError("embedding a Karpathy file, an image folder or a Parquet listing needs --model "
                             "(and --checkpoint); without a model, pass store folders or embeddings files for both "
                             "inputs")
        fps = {s.fingerprint for s in stores}
        if len(fps) > 1:
            raise UsageError(f"corpus and queries come from different models' stores {sorted(fps)}; "
                             f"their embeddings are not comparable")
        return None, stores[0]
    e = cfg.embed
    pipe = EmbedPipeline([ModelSpec(cfg.model, cfg.checkpoint, e.precision, e.device, pretrained=cfg.pretrained,
                                    random_init=cfg.random_init)], e, runner=runner)
    for s in stores:
        if s.fingerprint != pipe.fingerprint(0):
            raise UsageError(f"{s.dir} holds embeddings of {s.fingerprint}, but --model/--checkpoint "
                             f"give {pipe.fingerprint(0)}; pass the matching model or embeddings of this model")
    m = pipe.models[0]
    echo(f"model {m.arch_name} ({pipe.fingerprint(0)}) on {m.device}")
    return pipe, pipe.stores[0]


def _karpathy_groups(src: _MineInput, tables: Tables, rows: dict) -> None:
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


def _rebase_image_ids(cfg: MineConfig, sources: list[_MineInput]) -> str | None:
    """Name every image of a Karpathy file or folder by its path relative to one root: --images when
    it holds them all, else their deepest common folder. Returns the root (None: no such images)."""
    its = [s.items["image"] for s in sources if s.kind in ("karpathy", "folder") and "image" in s.items]
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


def _pairs(sources: list[_MineInput]) -> list[tuple[str, str, str, str]]:
    """(image path, image key, caption as written, caption key) of every Karpathy (image, caption)
    pair among the inputs, the queries' first: the rows of a NegCLIP training file."""
    out, seen = [], set()
    for src in sources:
        img, txt = src.items.get("image"), src.items.get("text")
        if src.kind != "karpathy" or img is None or txt is None or img.keys is None:
            continue
        for i, g in enumerate(txt.group):
            ikey, ckey = img.keys[int(g)], text_key(txt.entries[i])
            if ikey and (ikey, ckey) not in seen:
                seen.add((ikey, ckey))
                out.append((os.path.abspath(img.entries[int(g)].uri), ikey, txt.ids[i], ckey))
    return out


def build_problem(cfg: MineConfig, *, progress=None, echo=None, runner=None, lazy_corpus: bool = False) -> MineProblem:
    """Load both inputs, embed what the store lacks, and compile queries, corpus and positives.

    Positives of a query (in the corpus modality) are the items of its own source in its group: for
    a Karpathy file, a caption's image or an image's captions (t2t: every caption of the image, i2i:
    the image); elsewhere, the item itself in same-modal mining and none across modalities. Corpus
    rows are never returned for a query when their content key is a positive's, or their group
    (Karpathy image, keyed by image content when --images is given) is the query's. Duplicate query
    ids are merged, their positives united."""
    echo = echo or (lambda s: None)
    qmod, cmod = DIRECTIONS[cfg.direction]
    csrc = _load_source(cfg.corpus, cfg.images, cfg.captions)
    same = cfg.queries == cfg.corpus or os.path.abspath(cfg.queries) == os.path.abspath(cfg.corpus)
    qsrc = csrc if same else _load_source(cfg.queries, cfg.images, cfg.captions)
    for src, mod, role in ((csrc, cmod, "corpus"), (qsrc, qmod, "queries")):
        if mod not in src.items:
            hint = " (pass --images for the Karpathy file's images)" if src.kind == "karpathy" else ""
            raise UsageError(f"{role} {src.path} ({src.kind}) has no {mod}s, which direction {cfg.direction} "
                             f"needs{hint}; it has {sorted(src.items) or 'nothing'}")
    if qsrc.kind in ("karpathy", "wds") and cmod not in qsrc.items:
        raise UsageError(f"queries {qsrc.path}: pass --images so each caption's image (its positive, to be "
                         f"excluded) is known")
    pipe, store = _pipeline(cfg, [csrc, qsrc], echo, runner)
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
        if src.kind in ("karpathy", "wds"):
            _karpathy_groups(src, tables, rows)

    def read(src: _MineInput, mod: str, sel) -> np.ndarray:
        if src.kind == "clip_retrieval":  # a lazy view: rows are read block by block when searched
            return src.store.vectors(mod).select(sel)
        it = src.items[mod]
        return (src.store or store).read(mod, [it.keys[i] for i in sel])

    def gkey(it: _Items, i: int) -> str:
        return it.group_key[i] if it.group_key is not None else it.keys[i]

    # corpus
    cit = csrc.items[cmod]
    c_rows = [i for i, k in enumerate(cit.keys) if k]
    by_key: dict[str, list[int]] = {}
    for j, i in enumerate(c_rows):
        by_key.setdefault(cit.keys[i], []).append(j)
        g = gkey(cit, i)
        if g != cit.keys[i]:
            by_key.setdefault(g, []).append(j)
    if lazy_corpus and csrc.kind != "clip_retrieval":  # shard actors read their own slices from the store
        xb = StoreRows.of(csrc.store or store, cmod, [cit.keys[i] for i in c_rows])
    else:
        xb = read(csrc, cmod, c_rows)
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
        if qsrc.kind not in ("karpathy", "wds", "clip_retrieval") and qmod != cmod:
            pos = []  # no grouping across modalities outside Karpathy files and samples (shards, clip-retrieval)
        keys = {pos_items.keys[p] for p in pos} | {gkey(qit, i), k}
        j = order.setdefault(qit.ids[i], len(q_rows))
        if j == len(q_rows):
            q_rows.append(i)
            q_pos.append(list(pos))
            q_excl.append(keys)
        else:
            q_pos[j] = sorted(set(q_pos[j]) | set(pos))
            q_excl[j] |= keys
    xq = read(qsrc, qmod, q_rows)
    if isinstance(xq, np.ndarray):
        xq = xq.astype(np.float32)
    excl = [sorted({r for key in keys for r in by_key.get(key, ())}) for keys in q_excl]
    exclude_ptr = np.zeros(len(q_rows) + 1, np.int64)
    np.cumsum([len(e) for e in excl], out=exclude_ptr[1:])
    pos_ptr = np.zeros(len(q_rows) + 1, np.int64)
    np.cumsum([len(p) for p in q_pos], out=pos_ptr[1:])
    flat_pos = [p for ps in q_pos for p in ps]
    if pos_items is not None and flat_pos and qsrc.kind == "clip_retrieval":
        pos_emb = read(qsrc, cmod, flat_pos)  # lazy, like the corpus
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
                       "skipped": len(cit.keys) - len(c_rows)},
            "queries": {"path": cfg.queries, "kind": qsrc.kind, "rows": len(q_rows),
                        "skipped": sum(1 for k in qit.keys if not k)},
            "model_fingerprint": fp, "embed": embed}
    return MineProblem(
        xq=xq, xb=xb, query_ids=[qit.ids[i] for i in q_rows], corpus_ids=[cit.ids[i] for i in c_rows],
        modality=cmod, direction=cfg.direction,
        exclude_ptr=exclude_ptr, exclude_idx=np.array([r for e in excl for r in e], np.int64),
        pos_ptr=pos_ptr, pos_emb=pos_emb,
        pos_ids=[[pos_items.ids[p] for p in ps] for ps in q_pos] if pos_items is not None else None,
        query_keys=[qit.keys[i] for i in q_rows], corpus_keys=[cit.keys[i] for i in c_rows],
        pairs=_pairs(sources), meta=meta)
