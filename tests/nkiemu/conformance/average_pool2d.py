"""2-D average pooling with a 5-level access pattern and a free-axis sum (tutorial family: average_pool2d)."""
import nki
import nki.isa as nisa
import nki.language as nl
import nki.typing as nt


@nki.jit
def avgpool2d(in_tensor, pool):
    C, H, W = in_tensor.shape
    Ho, Wo = H // pool, W // pool
    out = nl.ndarray((C, Ho, Wo), dtype=in_tensor.dtype, buffer=nl.shared_hbm)
    x: nt.tensor[C, H, W] = nl.ndarray((C, H, W), dtype=in_tensor.dtype, buffer=nl.sbuf)
    nisa.dma_copy(dst=x, src=in_tensor)
    # view [c, ho, wo, ph, pw] -> x[c, ho*pool + ph, wo*pool + pw]; pool window axes last
    win = x.ap(pattern=[[H * W, C], [pool * W, Ho], [pool, Wo], [W, pool], [1, pool]], offset=0)
    s = nl.sum(win, axis=[3, 4], dtype=nl.float32)
    avg = nl.ndarray((C, Ho, Wo), dtype=in_tensor.dtype, buffer=nl.sbuf)
    nisa.tensor_scalar(dst=avg, data=s, op0=nl.multiply, operand0=1.0 / (pool * pool))
    nisa.dma_copy(dst=out, src=avg)
    return out
