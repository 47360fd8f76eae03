"""Analytic DF-MP2 nuclear gradients and relaxed densities (stages after the energy's; see kernel.py)."""

from .kernel import GradientResult, Gradients, kernel

__all__ = ["GradientResult", "Gradients", "kernel"]
