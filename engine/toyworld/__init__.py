"""The toy world: rendered coloured-shape scenes with every perturbation kind of the real suites."""

from .world import WorldConfig, build_world

__all__ = ["WorldConfig", "build_world"]
