"""The methods a run computes: MP2, its spin-scaled variants and double-hybrid functionals.

Every method is one DF-MP2 pair sweep on some reference orbitals; only the reference and the scaling of
the opposite-spin (os) and same-spin (ss) correlation energies differ:

    E = E_ref + c_os·E_os + c_ss·E_ss (+ E_disp)

- ``mp2``: Hartree–Fock reference, c_os = c_ss = 1.
- ``scs-mp2``: c_os = 6/5, c_ss = 1/3 (S. Grimme, J. Chem. Phys. 118, 9095 (2003)).
- ``sos-mp2``: c_os = 1.3, c_ss = 0 (Y. Jung, R. C. Lochan, A. D. Dutoi, M. Head-Gordon, J. Chem. Phys. 121,
  9793 (2004)); computed here with the ordinary O(N⁵) sweep, not the Laplace-transformed O(N⁴) one.
- double hybrids: a Kohn–Sham reference with the functional's DFT part (exact-exchange share through
  the device J/K builds, the semilocal part through PySCF/libxc on PySCF's grid), then the scaled MP2
  correlation of the Kohn–Sham orbitals, plus D3(BJ) dispersion where the functional's definition has it
  (from the ``dftd3`` library through ``pyscf-dispersion``, with the library's own parameters for that
  functional). Their DFT parts are written in PySCF's XC syntax with the published coefficients.
"""

from __future__ import annotations

from dataclasses import dataclass

from .errors import InputError

SCS_OS, SCS_SS = 6.0 / 5.0, 1.0 / 3.0  # Grimme's SCS-MP2 scalings, as PySCF's SCSMP2


@dataclass(frozen=True)
class Method:
    """One method: its name, the reference ("hf" or a PySCF XC string), the MP2 scalings and dispersion.

    dispersion: None, or (version, functional name the dispersion library knows), e.g. ("d3bj", "dsdpbep86").
    """

    name: str
    c_os: float
    c_ss: float
    xc: str | None = None
    dispersion: tuple[str, str] | None = None
    citation: str = ""

    @property
    def double_hybrid(self) -> bool:
        return self.xc is not None

    def record(self) -> dict:
        """What-ran entry of the method (functional, scalings, dispersion, source)."""
        out = {"name": self.name, "c_os": self.c_os, "c_ss": self.c_ss, "reference": "KS" if self.xc else "HF"}
        if self.xc:
            out["xc"] = self.xc
        if self.dispersion:
            out["dispersion"] = f"{self.dispersion[0]} ({self.dispersion[1]} parameters of the dftd3 library)"
        if self.citation:
            out["citation"] = self.citation
        return out


_B2PLYP = "S. Grimme, J. Chem. Phys. 124, 034108 (2006)"
_B2GP = "A. Karton, A. Tarnopolsky, J.-F. Lamère, G. C. Schatz, J. M. L. Martin, J. Phys. Chem. A 112, 12868 (2008)"
_DSD = "S. Kozuch, J. M. L. Martin, J. Comput. Chem. 34, 2327 (2013), DSD-PBEP86-D3BJ"
_REVDSD = "G. Santra, N. Sylvetsky, J. M. L. Martin, J. Phys. Chem. A 123, 5129 (2019), revDSD-PBEP86-D3(BJ)"

#: every method by its canonical name
METHODS: dict[str, Method] = {m.name: m for m in (
    Method("mp2", 1.0, 1.0),
    Method("scs-mp2", SCS_OS, SCS_SS, citation="S. Grimme, J. Chem. Phys. 118, 9095 (2003)"),
    Method("sos-mp2", 1.3, 0.0, citation="Y. Jung et al., J. Chem. Phys. 121, 9793 (2004)"),
    Method("b2plyp", 0.27, 0.27, "0.53*HF + 0.47*B88, 0.73*LYP", citation=_B2PLYP),
    Method("b2gp-plyp", 0.36, 0.36, "0.65*HF + 0.35*B88, 0.64*LYP", citation=_B2GP),
    Method("dsd-pbep86", 0.52, 0.22, "0.69*HF + 0.31*PBE, 0.44*P86", ("d3bj", "dsdpbep86"), _DSD),
    Method("revdsd-pbep86", 0.5785, 0.0799, "0.69*HF + 0.31*PBE, 0.4296*P86", ("d3bj", "revdsdpbep86"), _REVDSD),
)}

_ALIASES = {"scs": "scs-mp2", "sos": "sos-mp2", "b2gpplyp": "b2gp-plyp", "dsdpbep86": "dsd-pbep86",
            "dsd-pbep86-d3bj": "dsd-pbep86", "revdsdpbep86": "revdsd-pbep86", "revdsd-pbep86-d3bj": "revdsd-pbep86",
            "ri-mp2": "mp2", "df-mp2": "mp2", "scs-ri-mp2": "scs-mp2", "sos-ri-mp2": "sos-mp2"}


def get_method(name: str | Method) -> Method:
    """The method called ``name`` (case-insensitive; aliases such as ``DSD-PBEP86-D3BJ``); unknown names
    are an InputError listing the known ones."""
    if isinstance(name, Method):
        return name
    key = str(name).strip().lower().replace("_", "-")
    key = _ALIASES.get(key, key)
    if key not in METHODS:
        raise InputError(f"unknown method {name!r}: use {', '.join(METHODS)}")
    return METHODS[key]


def dispersion_energy(mol, method: Method) -> float:
    """The method's dispersion energy (Eh) for ``mol`` (0 without one), from the dftd3 library."""
    if method.dispersion is None:
        return 0.0
    try:
        from pyscf.dispersion import dftd3
    except ImportError:
        raise InputError(f"{method.name} includes D3(BJ) dispersion, which needs pyscf-dispersion: "
                         "pip install pyscf-dispersion") from None
    version, name = method.dispersion
    model = dftd3.DFTD3Dispersion(mol, xc=name, version=version)
    return float(model.get_dispersion()["energy"])
