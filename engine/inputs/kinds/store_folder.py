"""Input kind ``store``: one fingerprint folder of an embedding store, its vectors by content key."""
from __future__ import annotations

from pathlib import Path

from hardrank.errors import DataError
from hardrank.inputs.kind import MODALITIES, Embeddings, InputKind, InputOptions, Source
from hardrank.items import Tables
from hardrank.store.embedding_store import EmbeddingStore, is_store_folder, open_store
from hardrank.store.rows import StoreRows

__all__ = ["KIND"]


class _StoreEmbeddings(Embeddings):
    """A store folder read whole, checked first; its ids are its content keys (it holds no names)."""

    names_model = True  # a store folder is named by the fingerprint of the model that filled it

    def __init__(self, path: str):
        store: EmbeddingStore = open_store(Path(path))
        self.store, self.dir, self.fingerprint = store, store.dir, store.fingerprint
        self._keys = {mod: store.keys(mod) for mod in MODALITIES}
        self.modalities = tuple(mod for mod in MODALITIES if self._keys[mod])

    def check(self) -> None:
        """Every shard's checksum (a mining run reads the folder in full: check it all first)."""
        bad = sum(self.store.verify(mod) for mod in MODALITIES)
        if bad:
            raise DataError(f"{self.dir}: {bad} shard(s) of this store folder failed their checksum (named above), "
                            f"so their embeddings cannot be trusted; re-embed the items with --model/--checkpoint "
                            f"(eval or mine quarantine and re-encode them), or pass an intact copy of the store")

    def ids(self, modality: str) -> list[str]:
        return self._keys[modality]

    def keys(self, modality: str) -> list[str]:
        return self._keys[modality]

    def read(self, modality: str, rows, *, lazy: bool = False):
        keys = [self._keys[modality][int(r)] for r in rows]
        return StoreRows.of(self.store, modality, keys) if lazy else self.store.read(modality, keys)

    def for_tables(self, tables: Tables):
        raise DataError(f"{self.dir} is an embedding store folder: it names items by content key only, not by the "
                        f"suites' paths and captions; write its embeddings under the suites' ids with `hardrank "
                        f"store export {self.dir} --suite ... --out FILE.parquet` and pass that file")


class _StoreFolder(InputKind):
    name = "store"
    describe = "an embedding store fingerprint folder (holding manifest.json; ids: content keys)"
    yields = "embeddings"
    by_id = False
    markers = ("manifest.json",)

    def detect(self, path: str) -> bool:
        return is_store_folder(path)

    def open(self, path: str, options: InputOptions) -> Source:
        emb = _StoreEmbeddings(path)
        emb.check()
        return Source.of_embeddings(self.name, path, emb)

    def embeddings(self, path: str) -> Embeddings:
        return _StoreEmbeddings(path)


KIND = _StoreFolder()
