"""Hard-negative mining: per query, the top-k corpus items that score highest without being positives."""
from .export import write_training
from .problem import MineProblem, negatives_schema
from .run import mine, mine_arrays
from .sources import IMAGE_EXTENSIONS, build_problem

__all__ = ["mine", "mine_arrays", "build_problem", "MineProblem", "negatives_schema", "write_training",
           "IMAGE_EXTENSIONS"]
