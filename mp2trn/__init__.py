"""mp2trn: density-fitted MP2 on AWS Trainium, with CPU/CUDA paths and an NKI emulator."""

__version__ = "0.1.0"
