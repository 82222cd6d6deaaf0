"""The embedding store: content-keyed Arrow shards per model fingerprint, its key indexes (its export: hardrank.exports.store_ids)."""
from hardrank.store.embedding_store import EmbeddingStore, is_store_folder, open_store

__all__ = ["EmbeddingStore", "open_store", "is_store_folder"]
