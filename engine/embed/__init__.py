"""Embedding: decode and encode stages, the executors that run them, and the pipeline through the store."""
from .decode import PillowDecoder, image_size, make_decoder, make_transform
from .encode import ImageEncoder, TextEncoder, encode_text
from .job import DecodeStage, EmbedJob, EmbedSink, EmbedStats, EncodeStage
from .local import LocalRunner
from .pipeline import EmbedPipeline, embed_tables, make_runner, make_scan_mapper, table_embeddings, unique_labels

__all__ = ["EmbedPipeline", "embed_tables", "table_embeddings", "make_runner", "make_scan_mapper", "unique_labels",
           "EmbedJob",
           "EmbedSink", "EmbedStats", "DecodeStage", "EncodeStage", "LocalRunner", "PillowDecoder",
           "ImageEncoder", "TextEncoder", "encode_text", "make_transform", "make_decoder", "image_size"]
