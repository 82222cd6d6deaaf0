"""Pure-torch batch retrieval kernels: grouped rank extraction, streaming top-k, choice scores."""
from ._levels import PRECISIONS, resolve_precision
from .choice import choice_scores
from .masks import PRED_KINDS, giou_ciou, mask_iou_stats
from .ranking import TIE_RULES, GroupedRanks, best_positives, grouped_ranks
from .topk import topk

__all__ = ["GroupedRanks", "TIE_RULES", "PRECISIONS", "grouped_ranks", "best_positives", "topk", "resolve_precision",
           "choice_scores", "PRED_KINDS", "mask_iou_stats", "giou_ciou"]
