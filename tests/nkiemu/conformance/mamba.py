"""The selective-scan (Mamba SSM) step of the NKI "Fused Mamba" tutorial family, in three versions.

For each batch b, channel c and state s (fp32):
    dA[t]   = exp(delta[b, c, t] * A[c, s])
    dBu[t]  = delta[b, c, t] * u[b, c, t] * B[b, s, t]
    h[t]    = dA[t] * h[t-1] + dBu[t]                  (h[-1] = 0)
    out[b, c, t] += h[t] * C[b, s, t]                  (summed over s)

Channels sit on the partitions (tiles of 128), time on the free axis. The versions differ as the
tutorial describes them (nki/guides/tutorials/fused_mamba.rst): ``scan_per_state`` runs states outside
channel tiles and so loads the delta and u tiles again for every state; ``scan_hoisted`` reorders the loops
and loads them once per channel tile; ``scan_time_tiled`` also
cuts time into chunks of ``chunk`` steps so that its tiles stay small, carrying h from chunk to chunk.
The scan itself is ``nisa.tensor_tensor_scan`` (multiply, then add); B and C rows are broadcast over the
partitions with ``nl.broadcast_to``. Our own code: the algorithm and loop structure follow the tutorial's
text, not its files.
"""
import nki
import nki.isa as nisa
import nki.language as nl


def _state_step(dst_acc, delta_t, u_t, a_col, b_row, c_row, rows, steps, initial):
    """One state's contribution over a [rows, steps] tile; ``initial``: h before the tile (0.0, or the
    previous chunk's last column)."""
    d_a = nl.ndarray((rows, steps), dtype=nl.float32, buffer=nl.sbuf)
    nisa.activation(dst=d_a, op=nl.exp, data=delta_t, scale=a_col)
    d_u = nl.ndarray((rows, steps), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=d_u, data1=delta_t, data2=u_t, op=nl.multiply)
    d_bu = nl.ndarray((rows, steps), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=d_bu, data1=d_u, data2=nl.broadcast_to(b_row, (rows, steps)), op=nl.multiply)
    h = nl.ndarray((rows, steps), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor_scan(dst=h, data0=d_a, data1=d_bu, initial=initial,
                            op0=nl.multiply, op1=nl.add)
    hc = nl.ndarray((rows, steps), dtype=nl.float32, buffer=nl.sbuf)
    nisa.tensor_tensor(dst=hc, data1=h, data2=nl.broadcast_to(c_row, (rows, steps)), op=nl.multiply)
    nisa.tensor_tensor(dst=dst_acc, data1=dst_acc, data2=hc, op=nl.add)
    return h


def _load(src, shape):
    t = nl.ndarray(shape, dtype=nl.float32, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=src)
    return t


@nki.jit
def scan_per_state(delta, u, A, B, C):
    """The tutorial's first kernel: states outside, channel tiles inside, so delta and u are loaded again
    for every state; one accumulator per channel tile, stored after the last state."""
    nb, nc, nt = delta.shape
    ns = A.shape[1]
    P = nl.tile_size.pmax
    nct = nc // P
    out = nl.ndarray((nb, nc, nt), dtype=delta.dtype, buffer=nl.shared_hbm)
    for b in nl.affine_range(nb):
        acc = nl.ndarray((P, nct, nt), dtype=nl.float32, buffer=nl.sbuf)
        nisa.memset(dst=acc, value=0.0)
        for s in nl.sequential_range(ns):
            for ct in nl.affine_range(nct):
                c0 = ct * P
                delta_t = _load(delta[b, c0:c0 + P, 0:nt], (P, nt))
                u_t = _load(u[b, c0:c0 + P, 0:nt], (P, nt))
                a_col = _load(A[c0:c0 + P, s:s + 1], (P, 1))
                b_row = _load(B[b, s:s + 1, 0:nt], (1, nt))
                c_row = _load(C[b, s:s + 1, 0:nt], (1, nt))
                _state_step(acc[:, ct, :], delta_t, u_t, a_col, b_row, c_row, P, nt, 0.0)
        for ct in nl.affine_range(nct):
            nisa.dma_copy(dst=out[b, ct * P:(ct + 1) * P, 0:nt], src=acc[:, ct, :])
    return out


@nki.jit
def scan_hoisted(delta, u, A, B, C):
    nb, nc, nt = delta.shape
    ns = A.shape[1]
    P = nl.tile_size.pmax
    out = nl.ndarray((nb, nc, nt), dtype=delta.dtype, buffer=nl.shared_hbm)
    for b in nl.affine_range(nb):
        for ct in nl.affine_range(nc // P):
            c0 = ct * P
            delta_t = _load(delta[b, c0:c0 + P, 0:nt], (P, nt))          # once per channel tile
            u_t = _load(u[b, c0:c0 + P, 0:nt], (P, nt))
            acc = nl.ndarray((P, nt), dtype=nl.float32, buffer=nl.sbuf)
            nisa.memset(dst=acc, value=0.0)
            for s in nl.sequential_range(ns):
                a_col = _load(A[c0:c0 + P, s:s + 1], (P, 1))
                b_row = _load(B[b, s:s + 1, 0:nt], (1, nt))
                c_row = _load(C[b, s:s + 1, 0:nt], (1, nt))
                _state_step(acc, delta_t, u_t, a_col, b_row, c_row, P, nt, 0.0)
            nisa.dma_copy(dst=out[b, c0:c0 + P, 0:nt], src=acc)
    return out


@nki.jit
def scan_time_tiled(delta, u, A, B, C, chunk=512):
    nb, nc, nt = delta.shape
    ns = A.shape[1]
    P = nl.tile_size.pmax
    assert nt % chunk == 0
    out = nl.ndarray((nb, nc, nt), dtype=delta.dtype, buffer=nl.shared_hbm)
    for b in nl.affine_range(nb):
        for ct in nl.affine_range(nc // P):
            c0 = ct * P
            a_all = _load(A[c0:c0 + P, 0:ns], (P, ns))
            carry = nl.ndarray((P, ns), dtype=nl.float32, buffer=nl.sbuf)   # h at the end of the last chunk
            nisa.memset(dst=carry, value=0.0)
            for k in nl.sequential_range(nt // chunk):
                t0 = k * chunk
                delta_t = _load(delta[b, c0:c0 + P, t0:t0 + chunk], (P, chunk))
                u_t = _load(u[b, c0:c0 + P, t0:t0 + chunk], (P, chunk))
                acc = nl.ndarray((P, chunk), dtype=nl.float32, buffer=nl.sbuf)
                nisa.memset(dst=acc, value=0.0)
                for s in nl.sequential_range(ns):
                    b_row = _load(B[b, s:s + 1, t0:t0 + chunk], (1, chunk))
                    c_row = _load(C[b, s:s + 1, t0:t0 + chunk], (1, chunk))
                    h = _state_step(acc, delta_t, u_t, a_all[:, s:s + 1], b_row, c_row, P, chunk,
                                    carry[:, s:s + 1])
                    nisa.tensor_copy(dst=carry[:, s:s + 1], src=h[:, chunk - 1:chunk])
                nisa.dma_copy(dst=out[b, c0:c0 + P, t0:t0 + chunk], src=acc)
    return out


@nki.jit
def dependent_chain(x, steps=64):
    """``steps`` ScalarE instructions on a [128, 1] tile, each reading the one before (the perf guide's
    naive-scan pattern of one element per partition)."""
    P = x.shape[0]
    out = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.shared_hbm)
    a = _load(x, (P, 1))
    b = nl.ndarray((P, 1), dtype=nl.float32, buffer=nl.sbuf)
    for _ in nl.static_range(steps // 2):
        nisa.activation(dst=b, op=nl.copy, data=a, scale=0.5)
        nisa.activation(dst=a, op=nl.copy, data=b, scale=2.0)
    nisa.dma_copy(dst=out, src=a)
    return out


@nki.jit
def dma_exp(a):
    """The DMA overview's example: load a bf16 tile to SBUF, exp on ScalarE, store it."""
    P, F = a.shape
    out = nl.ndarray((P, F), dtype=a.dtype, buffer=nl.shared_hbm)
    t = nl.ndarray((P, F), dtype=a.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=t, src=a)
    e = nl.ndarray((P, F), dtype=a.dtype, buffer=nl.sbuf)
    nisa.activation(dst=e, op=nl.exp, data=t)
    nisa.dma_copy(dst=out, src=e)
    return out
