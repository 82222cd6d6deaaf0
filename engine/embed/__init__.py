"""Embedding: the pipeline through the store (the executor runs the stages of hardrank.encoding, whose names are
also here: the embed API in one place)."""
from hardrank.embed.pipeline import (
           EmbedPipeline,
           embed_tables,
           make_runner,
           make_scan_mapper,
           table_embeddings,
           unique_labels,
)
from hardrank.encoding.decode import PillowDecoder, image_size, make_transform
from hardrank.encoding.decoders import make_decoder
from hardrank.encoding.encode import ImageEncoder, TextEncoder, encode_text
from hardrank.encoding.job import DecodeStage, EmbedJob, EmbedSink, EmbedStats, EncodeStage

__all__ = ["EmbedPipeline", "embed_tables", "table_embeddings", "make_runner", "make_scan_mapper", "unique_labels",
           "EmbedJob",
           "EmbedSink", "EmbedStats", "DecodeStage", "EncodeStage", "PillowDecoder",
           "ImageEncoder", "TextEncoder", "encode_text", "make_transform", "make_decoder", "image_size"]
