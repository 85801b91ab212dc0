"""Request pipelines (kind ``pipeline``): requests that walk a graph of stages on shared resources."""

from .sim import simulate

__all__ = ["simulate"]
