"""Inputs beyond annotation files: WebDataset tar shards, img2dataset outputs, embedding files, clip-retrieval
folders and COCO masks, local or remote."""
from __future__ import annotations

from hardrank.inputs.webdataset import (
    IMAGE_EXTS,
    Sample,
    SampleSet,
    ShardScan,
    is_sample_source,
    parse_captions,
    read_samples,
    read_shards,
    sample_captions,
    scan_shard,
    scan_with,
    write_shard,
)

__all__ = ["IMAGE_EXTS", "Sample", "SampleSet", "ShardScan", "is_sample_source", "parse_captions", "read_samples",
           "read_shards", "sample_captions", "scan_shard", "scan_with", "write_shard"]
