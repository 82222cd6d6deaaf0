"""Hard-negative mining: per query, the top-k corpus items that score highest without being positives."""
from hardrank.mining.index import build_index
from hardrank.mining.inputs import IMAGE_EXTENSIONS, build_problem
from hardrank.mining.problem import MineProblem, negatives_schema
from hardrank.mining.run import mine, mine_arrays, recall_line
from hardrank.mining.training_table import write_training

__all__ = ["mine", "mine_arrays", "build_problem", "build_index", "MineProblem", "negatives_schema", "write_training",
           "IMAGE_EXTENSIONS", "recall_line"]
