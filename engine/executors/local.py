"""The in-process executor: the decode stage (and text tokenising) in a prefetch thread, the encode stage on
live models."""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from hardrank.encoding.job import DecodeStage, EmbedJob, EmbedSink, EncodeStage
from hardrank.models.spec import LoadedModel

__all__ = ["LocalRunner"]


class LocalRunner:
    """``runner(work)``: runs each ``(EmbedJob, EmbedSink)`` here, decoding (or tokenising) batch i+1 in a
    thread while batch i encodes. Uses the models the driver already loaded (no second load)."""

    def __init__(self, models: list[LoadedModel]):
        self.models = models

    def __call__(self, work: list[tuple[EmbedJob, EmbedSink]]) -> None:
        for job, sink in work:
            t = time.perf_counter()
            self._run(job, sink)
            sink.stats.seconds += time.perf_counter() - t

    def _run(self, job: EmbedJob, sink: EmbedSink) -> None:
        decode = DecodeStage(job if job.modality == "image" else None)
        encode = EncodeStage(job, models=self.models)
        stage = "decode" if job.modality == "image" else "read"

        def load(batch):  # in the prefetch thread: decode images, or tokenise texts, of the next batch
            t = time.perf_counter()
            return encode.prepare(decode(batch)), time.perf_counter() - t

        batches = list(job.batches())
        prefetch = ThreadPoolExecutor(1)
        try:
            fut = prefetch.submit(load, batches[0]) if batches else None
            for bi in range(len(batches)):
                batch, seconds = fut.result()
                if bi + 1 < len(batches):
                    fut = prefetch.submit(load, batches[bi + 1])  # decode the next while encoding this one
                sink.time(stage, seconds)
                t = time.perf_counter()
                out = encode(batch)
                sink.time("encode", time.perf_counter() - t)
                sink.deliver(out)
        finally:
            prefetch.shutdown(cancel_futures=True)
