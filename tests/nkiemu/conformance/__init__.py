"""Conformance kernels: our own NKI 0.3.0 code for the public NKI tutorial families.

Each file imports the genuine NKI module names (``import nki``, ``nki.language``, ``nki.isa``) and uses only
the 0.3.0 API, so it runs unchanged on a real NKI; the test-suite imports them with the emulator
registered as ``nki`` (``mp2trn.nkiemu.as_nki()``).
"""
