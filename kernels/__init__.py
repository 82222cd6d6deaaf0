"""Pure-torch batch retrieval kernels: grouped rank extraction, streaming top-k, choice scores."""
from .choice import choice_scores
from .ranking import TIE_RULES, GroupedRanks, grouped_ranks
from .topk import topk

__all__ = ["GroupedRanks", "TIE_RULES", "grouped_ranks", "topk", "choice_scores"]
