"""Embedding: decode and encode stages, and the pipeline through the store (executors run the stages)."""
from hardrank.embed.decode import PillowDecoder, image_size, make_transform
from hardrank.embed.decoders import make_decoder
from hardrank.embed.encode import ImageEncoder, TextEncoder, encode_text
from hardrank.embed.job import DecodeStage, EmbedJob, EmbedSink, EmbedStats, EncodeStage
from hardrank.embed.pipeline import (
           EmbedPipeline,
           embed_tables,
           make_runner,
           make_scan_mapper,
           table_embeddings,
           unique_labels,
)

__all__ = ["EmbedPipeline", "embed_tables", "table_embeddings", "make_runner", "make_scan_mapper", "unique_labels",
           "EmbedJob",
           "EmbedSink", "EmbedStats", "DecodeStage", "EncodeStage", "PillowDecoder",
           "ImageEncoder", "TextEncoder", "encode_text", "make_transform", "make_decoder", "image_size"]
