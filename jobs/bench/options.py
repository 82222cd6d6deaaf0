"""The bench commands' options: one frozen dataclass each, their flags made from their fields."""
from __future__ import annotations

from dataclasses import dataclass
from functools import partial

from hardrank import suite_registry
from hardrank.config import EmbedOptions, SuiteOptions, check_options, opt
from hardrank.cpus import check_threads
from hardrank.errors import UsageError
from hardrank.models.spec import forms_help

_OPEN_CLIP = ("open_clip", "open_clip_config", "open_clip_hub", "open_clip_folder")  # the kinds its stages take

__all__ = ["PipelineBenchConfig", "KernelBenchConfig", "KERNEL_METHODS"]

KERNEL_METHODS = ("gemm", "gemm_lp", "grouped", "grouped_lp", "topk", "topk_lp", "faiss", "argsort", "onehot")


@dataclass(frozen=True)
class PipelineBenchConfig:
    """One pipeline benchmark: K checkpoints of one model on suites, engine and naive pipeline."""

    model: str | None = opt(None, f"an open_clip model (default: the toy model): {forms_help(_OPEN_CLIP)}")
    checkpoints: tuple[str | None, ...] = opt((None,), "checkpoints of that model (globs ok)", flag="--checkpoint",
                                              path=True)
    pretrained: str | None = opt(None, "open_clip pretrained tag: its preprocessing, and without --checkpoint its "
                                 "weights from the local cache")
    suites: tuple[str, ...] = opt(("toy",), "suites to run", flag="--suite", listing="suites")
    suite_options: SuiteOptions = SuiteOptions()
    embed: EmbedOptions = EmbedOptions()  # device, batch size and decode threads of both pipelines
    budget_mb: int = opt(256, "kernel score-tile memory budget, MiB", minimum=1)
    sample: int = opt(2048, "unique items per modality for the per-stage timings", minimum=1)
    naive: bool = opt(True, "also run the naive baseline end to end")
    naive_workers: int | None = opt(None, "DataLoader workers of the naive pipeline (default: --decode-threads, "
                                    "the engine's decode threads; 0 decodes in the main process; at most 4 per "
                                    "CPU)", minimum=0, check=partial(check_threads, lowest=0))
    out: str = opt("results/bench", "folder for bench_pipeline.json/.png", path=True)
    work_dir: str | None = opt(None, "temporary store and results (default: the system's temp folder)", path=True,
                               cli=False)

    def __post_init__(self):
        object.__setattr__(self, "suites", tuple(self.suites))
        object.__setattr__(self, "checkpoints", tuple(self.checkpoints))
        check_options(self)
        if not self.model:
            raise UsageError(f"option model is required (--model): {forms_help(_OPEN_CLIP)}")
        if not self.checkpoints:
            raise UsageError("bench pipeline needs at least one checkpoint (--checkpoint; None = the random init)")
        if not self.suites:
            raise UsageError("option suites is empty; name at least one suite (--suite toy)")
        self.suite_options.check_suites(suite_registry.expand(self.suites, self.suite_options))

    @property
    def loader_workers(self) -> int:
        """The naive DataLoader's workers: ``naive_workers``, else the engine's decode threads."""
        return self.embed.decode_threads if self.naive_workers is None else self.naive_workers


@dataclass(frozen=True)
class KernelBenchConfig:
    """One kernel benchmark: a COCO-shaped ranking problem, the methods timed on it, how often."""

    nq: int = opt(5000, "queries (RoCOCO i2t: 5,000 images)")
    nb: int = opt(25010, "clean gallery (25,010 captions)")
    variants: int = opt(4, "added groups of 25,000 items (RoCOCO: 4 caption files)")
    d: int = opt(512, "embedding dimension")
    positives: int = opt(5, "positives per query")
    data: str = opt("matched", "matched: each caption is its image's embedding plus noise (cosine ~0.33 to it, "
                    "~0 +- 0.044 to others) and the added groups hold perturbed copies of the captions, like a CLIP "
                    "model on RoCOCO (R@1 ~40%%); random: unrelated unit vectors, every positive ranks ~15,000",
                    choices=("matched", "random"))
    precision: str = opt("auto", "the low-precision path's first GEMM (auto: bf16 on CPU, fp16 on CUDA, whatever "
                         "kernels.resolve_precision('auto') picks here)", choices=("auto", "bf16", "fp16"))
    baseline_queries: int = opt(500, "queries for the full-matrix baselines (they hold a queries x gallery "
                                "matrix); their time is scaled to --nq")
    device: str = opt("auto", "auto | cpu | cuda")
    budget_mb: int = opt(256, "kernel tile budget, MiB")
    repeat: int = opt(3, "timed rounds after a warm-up; every round runs each method once, in turn (best is "
                      "kept), so a shared machine's load drifts over all of them alike")
    skip: tuple[str, ...] = opt((), "methods to skip", choices=KERNEL_METHODS)
    gemm_tiling: str | None = opt(None, "time the bare GEMMs with this tiling only (e.g. 4096x1024) instead of the "
                                  "fastest of six", metavar="QxG")
    warmup: bool = opt(True, "an untimed first round (--no-warmup skips it: large shapes)")
    threads: int | None = opt(None, "torch and FAISS threads, 1 to 4 per CPU (default: the thread budget, as eval "
                              "and mine: hardrank.cpus)", minimum=1, check=check_threads)
    out: str = opt("benchmarks/results/bench_kernels.json", "the JSON written", path=True)

    def __post_init__(self):
        object.__setattr__(self, "skip", tuple(self.skip))
        check_options(self)
        for name, lo in (("nq", 1), ("nb", 1), ("d", 1), ("variants", 0), ("positives", 1), ("baseline_queries", 1),
                         ("budget_mb", 1), ("repeat", 1)):
            v = getattr(self, name)
            if v < lo:  # the flag first: an empty problem is named as the user typed it
                raise UsageError(f"--{name.replace('_', '-')} must be >= {lo}, got {v}")
