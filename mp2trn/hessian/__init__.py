"""The Hessian stage over the gradient: central differences of mp2trn's analytic gradients
(:mod:`.driver`, spread over ranks, resumable), the harmonic analysis with IR intensities
(:mod:`.vibrations`), thermochemistry (:mod:`.thermo`, PySCF's) and the frequency run that ties them to a
molecule and the QCSchema hessian document (:mod:`.frequencies`)."""

from .driver import DEFAULT_STEP, DisplacementStore, HessianResult, Point, finite_difference_hessian
from .frequencies import FrequencyResult, analyse_hessian, run_frequencies
from .thermo import Thermochemistry, point_group, symmetry_number, thermochemistry
from .vibrations import Vibrations, analyse, write_molden

__all__ = ["DEFAULT_STEP", "DisplacementStore", "FrequencyResult", "HessianResult", "Point", "Thermochemistry",
           "Vibrations", "analyse", "analyse_hessian", "finite_difference_hessian", "point_group", "run_frequencies",
           "symmetry_number", "thermochemistry", "write_molden"]
