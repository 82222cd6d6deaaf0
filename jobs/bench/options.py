"""The pipeline benchmark's options: one frozen dataclass, its flags made from its fields."""
from __future__ import annotations

from dataclasses import dataclass

from hardrank.config import EmbedOptions, SuiteOptions, check_options, opt
from hardrank.errors import UsageError

__all__ = ["PipelineBenchConfig"]


@dataclass(frozen=True)
class PipelineBenchConfig:
    """One pipeline benchmark: K checkpoints of one model on suites, engine and naive pipeline."""

    model: str | None = opt(None, "open_clip name, config .json or local-dir: (default: the toy model)")
    checkpoints: tuple[str | None, ...] = opt((None,), "checkpoints of that model (globs ok)", flag="--checkpoint",
                                              path=True)
    pretrained: str | None = opt(None, "open_clip pretrained tag: its preprocessing, and without --checkpoint its "
                                 "weights from the local cache")
    suites: tuple[str, ...] = opt(("toy",), "suites to run", flag="--suite")
    suite_options: SuiteOptions = SuiteOptions()
    embed: EmbedOptions = EmbedOptions()  # device, batch size and decode threads of both pipelines
    budget_mb: int = opt(256, "kernel score-tile memory budget, MiB", minimum=1)
    sample: int = opt(2048, "unique items per modality for the per-stage timings", minimum=1)
    naive: bool = opt(True, "also run the naive baseline end to end")
    naive_workers: int | None = opt(None, "DataLoader workers of the naive pipeline (default: --decode-threads, "
                                    "the engine's decode threads; 0 decodes in the main process)", minimum=0)
    work_dir: str | None = opt(None, "temporary store and results (default: the system's temp folder)", path=True,
                               cli=False)

    def __post_init__(self):
        object.__setattr__(self, "suites", tuple(self.suites))
        object.__setattr__(self, "checkpoints", tuple(self.checkpoints))
        check_options(self)
        if not self.model:
            raise UsageError("option model is required: an open_clip name, config .json or local-dir: (--model)")
        if not self.checkpoints:
            raise UsageError("bench pipeline needs at least one checkpoint (--checkpoint; None = the random init)")
        if not self.suites:
            raise UsageError("option suites is empty; name at least one suite (--suite toy)")

    @property
    def loader_workers(self) -> int:
        """The naive DataLoader's workers: ``naive_workers``, else the engine's decode threads."""
        return self.embed.decode_threads if self.naive_workers is None else self.naive_workers
