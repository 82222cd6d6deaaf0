"""Input kind ``clip_retrieval``: clip-retrieval's output folder as it is, read part by part."""
from __future__ import annotations

from hardrank.inputs.clip_retrieval import KINDS, ClipRetrievalFolder, is_clip_retrieval_folder, match_tables
from hardrank.inputs.kind import Embeddings, InputKind, InputOptions, Source
from hardrank.items import Tables

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

    def read(self, modality: str, rows, *, lazy: bool = False):
        return self.folder.vectors(modality).select(rows)  # rows are read block by block when searched

    def for_tables(self, tables: Tables):
        return match_tables(self.folder, tables)  # streamed over the metadata, one part at a time


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
