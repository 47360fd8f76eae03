"""``cuda``: the PyTorch backend (an optional extra: ``pip install mp2trn[cuda]``).

The backend takes any torch device, so the very same code runs on an NVIDIA GPU (``cuda``) and, in
CI, on the CPU build of torch. Blocks are moved to the device once per call, except B, which the pair
steps of the energy and the gradient read from one copy on the device when it fits (:meth:`TorchDevice.hold`);
per-pair sums are reduced on the device in fp64 and copied back as (ni, nj) arrays.
"""

from __future__ import annotations

import os
import weakref
from typing import Any

import numpy as np

from ..errors import DeviceUnavailableError
from .base import Device, PairDensities, root_array


def import_torch():
    """Import torch or raise DeviceUnavailableError naming what to install."""
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        raise DeviceUnavailableError(
            "device 'cuda' needs PyTorch, which is not installed: pip install 'mp2trn[cuda]'"
        ) from None
    return torch


class TorchDevice(Device):
    """PyTorch device. ``torch_device`` is e.g. "cuda", "cuda:1" or "cpu" (CI)."""

    supported_precisions = ("fp64", "fp32")

    def __init__(self, precision: str = "fp64", torch_device: str = "cuda"):
        torch = import_torch()
        self.torch = torch
        self.precision = precision
        dev = torch.device(torch_device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise DeviceUnavailableError(
                f"device '{torch_device}' asked for, but torch {torch.__version__} sees no CUDA GPU "
                "(install a CUDA build of PyTorch on a machine with an NVIDIA GPU, or use --device cpu)"
            )
        self.device = dev
        #: B held on the device (id of the host array -> (weak reference to it, its copy)), :meth:`hold`
        self._held: dict[int, tuple[weakref.ref, Any]] = {}
        self.name = "cuda" if dev.type == "cuda" else f"torch-{dev.type}"
        self._tdtype = getattr(torch, self.mode.compute.name)   # float32 / float64

    def describe(self) -> dict[str, Any]:
        info = {"device": self.name, "precision": self.precision, "backend": f"torch {self.torch.__version__}"}
        if self.mode.compute != np.float64:
            info["precision_detail"] = "AO->MO transform in fp64; metric solve and pair step in fp32; pair sums in fp64"
        if self.device.type == "cuda":
            info["gpu"] = self.torch.cuda.get_device_name(self.device)
        return info

    def memory_mb(self) -> float | None:
        """The GPU's free memory now, as CUDA reports it (torch.cuda.mem_get_info); None on a CPU torch device,
        which computes in host memory."""
        if self.device.type != "cuda":
            return None
        return self.torch.cuda.mem_get_info(self.device)[0] / 1e6

    def computes_on_host_cores(self) -> bool:
        return self.device.type != "cuda"   # a GPU computes on its own; torch on a CPU shares the host's cores

    #: at most this share of the GPU's free memory holds B (the rest for the launches' work arrays)
    HOLD_SHARE = 0.5

    def hold(self, arrays, add=True):
        """B copied to the torch device once, in the compute dtype, when it fits :attr:`HOLD_SHARE` of the
        GPU's free memory (a CPU torch device: always, a copy in host memory as a GPU's would be, the test
        vehicle of this path); every later view of these arrays (:meth:`_t`) is a strided view of the copy.
        Arrays held already are not sent again. An entry goes when its host array does."""
        if os.environ.get("MP2TRN_HOLD_B", "1") == "0":    # a benchmark's switch (scripts/bench_gpu4pyscf.py)
            return "sent with each launch (MP2TRN_HOLD_B=0)"
        new = [a for a in arrays if not self._holds(a)]
        where = "GPU" if self.device.type == "cuda" else f"torch {self.device.type}"
        if not new:
            return f"resident in {where} memory ({self.held_mb():.0f} MB, held since the energy)"
        if not add:
            return "sent with each launch (not held by the energy)"
        need = sum(a.size for a in new) * self.mode.compute.itemsize
        free = self.memory_mb()
        if free is not None and need > self.HOLD_SHARE * free * 1e6:
            return (f"sent with each launch: holding B would take {need / 1e6:.0f} MB, more than "
                    f"{self.HOLD_SHARE:.0%} of the GPU's {free:.0f} MB free")
        held = self._held     # the callbacks close over the dict, not the device (no cycle through self)
        for a in new:
            copy = self.torch.as_tensor(a, device=self.device).to(self._tdtype)
            if copy.untyped_storage().data_ptr() == a.__array_interface__["data"][0]:
                copy = copy.clone()     # torch on the CPU would share the array: a copy, as on a GPU
            held[id(a)] = (weakref.ref(a, lambda _r, k=id(a): held.pop(k, None)), copy)
        return f"resident in {where} memory ({need / 1e6:.0f} MB, sent once)"

    def _holds(self, a: np.ndarray) -> bool:
        entry = self._held.get(id(a))
        return entry is not None and entry[0]() is a

    def held_mb(self) -> float:
        return sum(copy.nbytes for _, copy in self._held.values()) / 1e6

    def release(self) -> None:
        self._held.clear()

    def close(self) -> None:
        self.release()
        super().close()

    def _t(self, a: np.ndarray, dtype=None):
        """``a`` on the torch device in the compute dtype (or ``dtype``): a view of a held copy when ``a`` is
        a view of a held array (no transfer), else a copy."""
        a = np.asarray(a)
        root = root_array(a)
        entry = self._held.get(id(root))
        if dtype is None and entry is not None and entry[0]() is root and a.dtype == root.dtype:
            offset, rem = divmod(a.__array_interface__["data"][0] - root.__array_interface__["data"][0], a.itemsize)
            if rem == 0 and all(st % a.itemsize == 0 for st in a.strides):
                return self.torch.as_strided(entry[1], a.shape, [st // a.itemsize for st in a.strides], offset)
        return self.torch.as_tensor(a, device=self.device).to(dtype or self._tdtype)

    def ao_to_mo(self, ao, c_occ, c_vir):
        """In fp64 in every precision, as on the cpu device: the transform's cancellation (|C| up to ~10)
        is where fp32 loses most of its accuracy (docs/precision.md), and a GPU's fp64 GEMMs cost this
        O(N⁴) step little beside the fp32 pair step."""
        f64 = self.torch.float64
        p, nao, _ = ao.shape
        half = (self._t(ao, f64).reshape(p * nao, nao) @ self._t(c_occ, f64)).reshape(p, nao, -1)
        out = self.torch.matmul(half.transpose(1, 2), self._t(c_vir, f64))
        return out.cpu().numpy().astype(self.storage_dtype, copy=False)

    def metric_solve(self, l_chol, v):
        b = self.torch.linalg.solve_triangular(self._t(l_chol), self._t(v), upper=False)
        return b.cpu().numpy().astype(self.storage_dtype, copy=False)

    # -- the orbital response's GEMMs: the operands stay on the GPU, in the device's precision -----------------
    @property
    def response_precision(self) -> str:
        return self.precision

    def response_blocks(self, rows, channels, out):
        """In fp64, as its AO→MO transform (:meth:`ao_to_mo`)."""
        f64 = self.torch.float64
        q, nao, _ = rows.shape
        flat = self._t(rows, f64).reshape(q * nao, nao)
        for (c_occ, c_vir), (oo, ov, vv) in zip(channels, out):
            o = c_occ.shape[1]
            co, cv = self._t(c_occ, f64), self._t(c_vir, f64)
            half = (flat @ self.torch.cat([co, cv], dim=1)).reshape(q, nao, -1)    # B_Q C
            occ = self.torch.matmul(co.T, half).cpu().numpy()
            oo[...], ov[...] = occ[:, :, :o], occ[:, :, o:]
            vv[...] = self.torch.matmul(cv.T, half[:, :, o:]).cpu().numpy()

    def response_operand(self, a_t, moving=False):
        return self._t(a_t)

    #: grouped results stay on the GPU: no host buffer to write them into
    response_grouped_on_host = False

    def response_grouped(self, a_t, b, width, stage="zvector", out=None):
        k, m = a_t.shape
        g = b.shape[1] // width
        return self.torch.matmul(self._t(a_t).T, b.reshape(k, g, width).transpose(0, 1)).reshape(g * m, width)

    def response_gemm(self, a_t, b, stage="zvector", out=None):
        a = a_t if self.torch.is_tensor(a_t) else self._t(a_t)
        b = b if self.torch.is_tensor(b) else self._t(b)
        c = (a.T @ b).to(self.torch.float64).cpu().numpy()
        if out is None:
            return c
        out[...] = c
        return out

    # -- SCF J/K: the tensor stays on the GPU for the whole SCF when it fits (mp2trn.jk decides) ----------
    has_jk = True

    def jk_tensor(self, block, dtype, keep_copy=True):   # the copy is the working tensor: always kept
        return self.torch.as_tensor(block, device=self.device).to(self._torch_dtype(dtype))

    def jk_block(self, block, factors, dm, with_j, with_k):
        torch = self.torch
        p, nao, _ = block.shape
        rho = torch.zeros(p, dtype=torch.float64, device=self.device)
        vk = torch.zeros((nao, nao), dtype=torch.float64, device=self.device) if with_k else None
        for c, sign in factors:
            if c.shape[1] == 0 or not with_k:
                continue
            n = c.shape[1]
            ct = torch.as_tensor(np.ascontiguousarray(c.T), device=self.device).to(block.dtype)
            x = torch.matmul(ct, block)                                        # (p, n, nao)
            z = x.reshape(p * n, nao)
            vk += sign * (z.T @ z).to(torch.float64)
            if with_j:
                rho += sign * torch.einsum("pin,in->p", x, ct).to(torch.float64)
        vj = None
        if with_j:
            flat = block.reshape(p, nao * nao)
            if not with_k:
                d = torch.as_tensor(np.asarray(dm), device=self.device).to(block.dtype)
                rho = (flat @ d.reshape(-1)).to(torch.float64)
            vj = (rho.to(block.dtype) @ flat).reshape(nao, nao).to(torch.float64).cpu().numpy()
        return vj, (vk.cpu().numpy() if vk is not None else None)

    def _torch_dtype(self, dtype):
        return getattr(self.torch, np.dtype(dtype).name)

    def pair_energies(self, b_i, b_j, e_i, e_j, ev_a, ev_b, exchange):
        torch = self.torch
        same = b_j is None
        naux, ni, nva = b_i.shape
        x_i = self._t(b_i).reshape(naux, ni * nva)
        e_i_t, e_j_t = self._t(e_i), self._t(e_j)
        if same:
            ev_b = ev_a
        e_ab = self._t(ev_a)[:, None] + self._t(ev_b)[None, :]
        nj = ni if same else b_j.shape[1]
        os_ = torch.zeros((ni, nj), dtype=torch.float64, device=self.device)
        xx = torch.zeros_like(os_) if exchange else None
        x_j = x_i if same else self._t(b_j).reshape(naux, -1)
        for i in range(ni):
            j0 = i if same else 0
            rows = x_i[:, i * nva : (i + 1) * nva]
            nvb = e_ab.shape[1]
            m = (rows.T @ x_j[:, j0 * nvb :]).reshape(nva, nj - j0, nvb)
            w = m / (e_i_t[i] + e_j_t[j0:][None, :, None] - e_ab[:, None, :])
            # products in the compute dtype, their sums in fp64 (an fp32 sum of nva·nvb terms drifts by µEh)
            os_[i, j0:] = (w * m).sum(dim=(0, 2), dtype=torch.float64)
            if exchange:
                xx[i, j0:] = (w * m.permute(2, 1, 0)).sum(dim=(0, 2), dtype=torch.float64)
        return os_.cpu().numpy(), None if xx is None else xx.cpu().numpy()

    # -- the gradient's pair step: the cpu device's per-k GEMMs, on the torch device ------------------------
    has_pair_densities = True
    #: each pair's energy sums in fp64 from the compute dtype's products, as :meth:`pair_energies` sums them
    sweep_energies = True

    def pair_densities(self, b_all, b_k, e_all, e_k, ev_all, ev_k, c_direct, c_exch, vir_k, energies=False):
        torch = self.torch
        naux, ni, nva = b_all.shape
        nk, nvb = b_k.shape[1], b_k.shape[2]
        x_all = self._t(b_all).reshape(naux, ni * nva)
        x_k = self._t(b_k)
        denom = self._t(e_all)[:, None, None] - self._t(ev_all)[None, :, None] - self._t(ev_k)[None, None, :]
        e_k_t = self._t(e_k)
        f64 = dict(dtype=torch.float64, device=self.device)
        gamma = torch.empty((naux, nk, nvb), **f64)
        p_occ, p_vir_all = torch.zeros((ni, ni), **f64), torch.zeros((nva, nva), **f64)
        p_vir_k = torch.zeros((nvb, nvb), **f64) if vir_k else None
        pair_os = torch.zeros((ni, nk), **f64) if energies else None
        pair_x = torch.zeros((ni, nk), **f64) if energies and c_exch else None
        for k in range(nk):
            if energies:    # T kept beside τ only for the sums
                raw = (x_all.T @ x_k[:, k, :]).reshape(ni, nva, nvb)       # T_ik^ab
                tau = raw / (denom + e_k_t[k])
                pair_os[:, k] = (raw * tau).sum(dim=(1, 2), dtype=torch.float64)
                if pair_x is not None:
                    pair_x[:, k] = (raw * tau.transpose(1, 2)).sum(dim=(1, 2), dtype=torch.float64)
                del raw
            else:
                tau = (x_all.T @ x_k[:, k, :]).reshape(ni, nva, nvb) / (denom + e_k_t[k])
            tt = c_direct * tau - c_exch * tau.transpose(1, 2) if c_exch else c_direct * tau
            gamma[:, k, :] = (x_all @ tt.reshape(ni * nva, nvb)).to(torch.float64)
            p_occ += (tau.reshape(ni, -1) @ tt.reshape(ni, -1).T).to(torch.float64)
            p_vir_all += torch.einsum("iab,icb->ac", tau, tt).to(torch.float64)
            if vir_k:
                p_vir_k += (tau.reshape(-1, nvb).T @ tt.reshape(-1, nvb)).to(torch.float64)
        return PairDensities(gamma.cpu().numpy(), p_occ.cpu().numpy(), p_vir_all.cpu().numpy(),
                             None if p_vir_k is None else p_vir_k.cpu().numpy(),
                             *((pair_os.cpu().numpy(), None if pair_x is None else pair_x.cpu().numpy())
                               if energies else ()))
