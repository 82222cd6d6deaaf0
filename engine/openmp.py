"""OpenMP's wait policy for this process: PASSIVE unless the user chose one (the package's one import-time effect)."""
from __future__ import annotations

import os
import sys

__all__ = ["TORCH_FIRST"]

# OpenMP threads must sleep, not spin, between parallel regions. libgomp's default spins 300,000
# rounds first, and on shared cores those spinning threads starve the main thread: every small torch
# op then costs a scheduler time slice, so a run's time follows its op count (K checkpoints x layers
# x batches), not its work (400 captions x 6 toy checkpoints at --batch-size 8: 108 s, 4.6 s with
# PASSIVE; 2 cores at load 20). libgomp reads this once, when torch loads it: hence here, in a module
# that ``hardrank/__init__`` imports (and nothing else), so any import of a hardrank module runs it
# before one imports torch. A policy the user set is kept; one torch imported before hardrank has read
# already (``cpus.wait_policy`` says so in every result). The same holds for FAISS's own libgomp
# (loaded later) and MKL (on libgomp in torch's builds); torch's inter-op pool waits on condition
# variables, never spins. Child processes (Ray workers) inherit it.
TORCH_FIRST = "torch" in sys.modules and "OMP_WAIT_POLICY" not in os.environ
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
