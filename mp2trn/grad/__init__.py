"""Analytic DF-MP2 nuclear gradients and relaxed densities (stages after the energy's; see dfmp2.py)."""

from .dfmp2 import GradientResult, Gradients, kernel

__all__ = ["GradientResult", "Gradients", "kernel"]
