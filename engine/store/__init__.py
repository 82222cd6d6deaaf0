"""The embedding store: content-keyed Arrow shards per model fingerprint and its key indexes."""
from hardrank.store.embedding_store import EmbeddingStore, is_store_folder, open_store

__all__ = ["EmbeddingStore", "open_store", "is_store_folder"]
