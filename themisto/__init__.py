"""Themisto: a Jupyter-based runtime benchmark built from replayed development trajectories."""

__version__ = "0.1.0"
