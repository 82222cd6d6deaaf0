"""Input kind ``clip_retrieval``: clip-retrieval's output folder as it is, read part by part."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from hardrank.errors import DataError
from hardrank.inputs.clip_retrieval import KINDS, ClipRetrievalFolder, is_clip_retrieval_folder, match_tables
from hardrank.inputs.kind import Embeddings, InputKind, InputOptions, Source
from hardrank.items import Tables, text_key
from hardrank.text import pre_caption

__all__ = ["KIND"]


class _FolderEmbeddings(Embeddings):
    """Ids from the metadata (image_path, caption), vectors through memory maps of the .npy parts: nothing
    is loaded whole, reads return lazy views (``VectorRows``)."""

    def __init__(self, path: str):
        self.folder = ClipRetrievalFolder(path)
        self.dir, self.fingerprint, self.modalities = self.folder.root, self.folder.fingerprint, self.folder.kinds

    def ids(self, modality: str) -> list[str]:
        return self.folder.ids(modality)

    def vectors(self, modality: str):
        return self.folder.vectors(modality)

    def count(self, modality: str) -> int:
        self.folder.vectors(modality)  # (a kind it lacks is named)
        return self.folder.num_rows

    def columns(self, modality: str, paired: bool = False):
        """One part's (ids, keys, groups) at a time, from its metadata file: image keys ``id:<image_path>``
        built by Arrow, caption keys hashed a part at a time; a caption's group is its image's key."""
        col = KINDS[modality][2]
        with_image = paired and modality != "image" and "image" in self.modalities
        for p in self.folder.parts:
            names = [col] + ([KINDS["image"][2]] if with_image else [])
            t = pq.read_table(p.metadata, columns=names)
            for name in names:
                if t.column(name).null_count:
                    first = int(np.flatnonzero(t.column(name).is_null().to_numpy(zero_copy_only=False))[0])
                    raise DataError(f"{p.metadata}: column {name!r} is null at row {first}; every sample needs one")
            ids = t.column(col).combine_chunks().cast(pa.string())
            yield ids, self._keys(modality, ids), (_image_keys(t.column(KINDS["image"][2]).combine_chunks())
                                                   if with_image else pa.nulls(len(ids), pa.string()))

    @staticmethod
    def _keys(modality: str, ids: pa.Array) -> pa.Array:
        if modality == "image":
            return _image_keys(ids)
        return pa.array([text_key(pre_caption(c)) for c in ids.to_pylist()], pa.string())

    def read(self, modality: str, rows, *, lazy: bool = False):
        if isinstance(rows, range) and rows == range(self.folder.num_rows):
            return self.folder.vectors(modality)  # the whole corpus: a view over every part, no row list
        return self.folder.vectors(modality).select(rows)  # rows are read block by block when searched

    def for_tables(self, tables: Tables):
        return match_tables(self.folder, tables)  # streamed over the metadata, one part at a time


def _image_keys(paths: pa.Array) -> pa.Array:
    """``id:<image_path>`` for each path (the key ``Embeddings.keys`` gives an image id)."""
    return pc.binary_join_element_wise(pa.scalar("id:"), paths.cast(pa.string()), "")


class _ClipRetrievalFolder(InputKind):
    name = "clip_retrieval"
    describe = "a clip-retrieval output folder (img_emb/, text_emb/, metadata/)"
    yields = "embeddings"
    markers = tuple(folder for folder, _, _ in KINDS.values())  # img_emb, text_emb

    def detect(self, path: str) -> bool:
        return is_clip_retrieval_folder(path)

    def open(self, path: str, options: InputOptions) -> Source:
        """Row i's image and caption are one sample, so they are each other's positives (as a Karpathy
        image and its captions are): the group of both is the image's key."""
        return Source.of_embeddings(self.name, path, self.embeddings(path), paired=True)

    def embeddings(self, path: str) -> Embeddings:
        return _FolderEmbeddings(path)


KIND = _ClipRetrievalFolder()
