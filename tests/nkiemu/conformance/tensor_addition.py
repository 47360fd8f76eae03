"""Tiled element-wise addition (tutorial family: tensor_addition), 128 x 512 tiles."""
import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def tensor_add(a, b):
    rows, cols = a.shape
    TP = nl.tile_size.pmax   # 128 partitions per tile
    TF = 512                 # free elements per tile
    assert rows % TP == 0 and cols % TF == 0
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    for i in nl.affine_range(rows // TP):
        for j in nl.affine_range(cols // TF):
            xa = nl.ndarray((TP, TF), dtype=a.dtype, buffer=nl.sbuf)
            xb = nl.ndarray((TP, TF), dtype=b.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=xa, src=a[i * TP:(i + 1) * TP, j * TF:(j + 1) * TF])
            nisa.dma_copy(dst=xb, src=b[nl.ds(i * TP, TP), nl.ds(j * TF, TF)])
            s = nl.ndarray((TP, TF), dtype=a.dtype, buffer=nl.sbuf)
            nisa.tensor_tensor(dst=s, data1=xa, data2=xb, op=nl.add)
            nisa.dma_copy(dst=out[i * TP:(i + 1) * TP, j * TF:(j + 1) * TF], src=s)
    return out


@nki.jit
def tensor_add_nl(a, b):
    """The same with the 0.3.0 experimental nl.load / nl.add / nl.store wrappers (one tile)."""
    out = nl.ndarray(a.shape, dtype=a.dtype, buffer=nl.shared_hbm)
    x = nl.load(a)
    y = nl.load(b)
    nl.store(out, nl.add(x, y))
    return out
