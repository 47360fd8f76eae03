"""Per-partition 2-D transpose of flattened [F1, F2] rows (tutorial family: transpose2d).

Row p of the input holds an F1 x F2 matrix in row-major order; the output row holds its F2 x F1
transpose. Done SBUF->SBUF with single-column ``tensor_copy`` instructions on ``nl.ds`` slices.
"""
import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def transpose_rows(in_tensor, shape2d):
    P, F = in_tensor.shape
    f1, f2 = shape2d
    assert f1 * f2 == F
    out = nl.ndarray((P, F), dtype=in_tensor.dtype, buffer=nl.shared_hbm)
    src = nl.ndarray((P, F), dtype=in_tensor.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=src, src=in_tensor)
    dst = nl.ndarray((P, F), dtype=in_tensor.dtype, buffer=nl.sbuf)
    for i in nl.static_range(f1):
        for j in nl.static_range(f2):
            nisa.tensor_copy(dst=dst[:, nl.ds(j * f1 + i, 1)], src=src[:, nl.ds(i * f2 + j, 1)])
    nisa.dma_copy(dst=out, src=dst)
    return out


@nki.jit
def transpose_tile_pe(in_tensor):
    """[P, F] -> [F, P] on TensorE (nc_transpose to PSUM, tensor_copy out), P, F <= 128."""
    P, F = in_tensor.shape
    out = nl.ndarray((F, P), dtype=in_tensor.dtype, buffer=nl.shared_hbm)
    x = nl.ndarray((P, F), dtype=in_tensor.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x, src=in_tensor)
    t_ps = nl.ndarray((F, P), dtype=in_tensor.dtype, buffer=nl.psum)
    nisa.nc_transpose(dst=t_ps, data=x, engine=nisa.engine.tensor)
    t_sb = nl.ndarray((F, P), dtype=in_tensor.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=t_sb, src=t_ps)
    nisa.dma_copy(dst=out, src=t_sb)
    return out
