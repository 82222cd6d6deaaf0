"""Scoring: search backends over the kernels, metrics and their tie rules, and the results they become."""
from hardrank.scoring.rank import score_choice, score_ranking
from hardrank.scoring.results import ResultFile, read_results, write_result

__all__ = ["score_ranking", "score_choice", "write_result", "read_results", "ResultFile"]
