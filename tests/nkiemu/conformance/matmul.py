"""The matmul progression of the NKI optimization guide, written from scratch (tutorial family:
matrix_multiplication). All compute ``result[M, N] = lhsT[K, M].T @ rhs[K, N]``.

1. ``mm_single_tile``   one TensorE instruction (K <= 128, M <= 128, N <= 512)
2. ``mm_tiled``         loops over M/N/K tiles, loads every operand tile inside the K loop, PSUM accumulates
3. ``mm_hoisted``       lhsT column panel loaded once per M tile, rhs panel once per (M, N) tile
4. ``mm_block_free``    blocks of TILES_M x TILES_N output tiles share their operand loads
5. ``mm_blocked``       all three dims blocked; each operand block arrives in ONE dma_copy through an
                        access pattern; K blocks accumulate in SBUF (fp32) as PSUM has only 8 banks
6. ``mm_tiles_in_loops`` the optimization guide's last step with its allocation pattern: the result
                        M tiles of one N block are allocated (and zeroed) inside the N loop and stay
                        live through the K loop; the operand block tiles are allocated inside the K
                        loop; accumulation in the result's dtype. Its live SBUF per partition is
                        (M/128)·TILES_N·512 + TILES_K·TILES_N·512 + TILES_K·TILES_M·128 elements
                        (fp32 at M=4096, TILES 16/2/8: 229,376 B — over trn1's 180,224, so the
                        compiler spills; bf16: 114,688 B)
"""
import nki
import nki.isa as nisa
import nki.language as nl


@nki.jit
def mm_single_tile(lhsT, rhs):
    K, M = lhsT.shape
    K2, N = rhs.shape
    assert K == K2 and K <= nl.tile_size.pmax
    assert M <= nl.tile_size.gemm_stationary_fmax and N <= nl.tile_size.gemm_moving_fmax
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    a = nl.ndarray((K, M), dtype=lhsT.dtype, buffer=nl.sbuf)
    b = nl.ndarray((K, N), dtype=rhs.dtype, buffer=nl.sbuf)
    nisa.dma_copy(a, lhsT)                      # positional dst, src
    nisa.dma_copy(dst=b, src=rhs)
    acc = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)
    nisa.nc_matmul(acc, a, b)                   # positional dst, stationary, moving
    res = nl.ndarray((M, N), dtype=result.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)          # PSUM fp32 -> SBUF, RNE cast to the output dtype
    nisa.dma_copy(dst=result, src=res)
    return result


def _tiles(lhsT, rhs):
    K, M = lhsT.shape
    K2, N = rhs.shape
    TK, TM, TN = nl.tile_size.pmax, nl.tile_size.gemm_stationary_fmax, nl.tile_size.gemm_moving_fmax
    assert K == K2 and K % TK == 0 and M % TM == 0 and N % TN == 0
    return K, M, N, TK, TM, TN


@nki.jit
def mm_tiled(lhsT, rhs):
    K, M, N, TK, TM, TN = _tiles(lhsT, rhs)
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // TM):
        for n in nl.affine_range(N // TN):
            acc = nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TK):
                a = nl.ndarray((TK, TM), dtype=lhsT.dtype, buffer=nl.sbuf)
                b = nl.ndarray((TK, TN), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=a, src=lhsT[k * TK:(k + 1) * TK, m * TM:(m + 1) * TM])
                nisa.dma_copy(dst=b, src=rhs[k * TK:(k + 1) * TK, n * TN:(n + 1) * TN])
                nisa.nc_matmul(dst=acc, stationary=a, moving=b)   # accumulate=None: first write overwrites
            res = nl.ndarray((TM, TN), dtype=result.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res, src=acc)
            nisa.dma_copy(dst=result[m * TM:(m + 1) * TM, n * TN:(n + 1) * TN], src=res)
    return result


@nki.jit
def mm_hoisted(lhsT, rhs):
    K, M, N, TK, TM, TN = _tiles(lhsT, rhs)
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for m in nl.affine_range(M // TM):
        a_panel = []
        for k in nl.affine_range(K // TK):
            a = nl.ndarray((TK, TM), dtype=lhsT.dtype, buffer=nl.sbuf)
            nisa.dma_copy(dst=a, src=lhsT[k * TK:(k + 1) * TK, m * TM:(m + 1) * TM])
            a_panel.append(a)
        for n in nl.affine_range(N // TN):
            b_panel = []
            for k in nl.affine_range(K // TK):
                b = nl.ndarray((TK, TN), dtype=rhs.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=b, src=rhs[k * TK:(k + 1) * TK, n * TN:(n + 1) * TN])
                b_panel.append(b)
            acc = nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.psum)
            for k in nl.affine_range(K // TK):
                nisa.nc_matmul(dst=acc, stationary=a_panel[k], moving=b_panel[k])
            res = nl.ndarray((TM, TN), dtype=result.dtype, buffer=nl.sbuf)
            nisa.tensor_copy(dst=res, src=acc)
            nisa.dma_copy(dst=result[m * TM:(m + 1) * TM, n * TN:(n + 1) * TN], src=res)
    return result


@nki.jit
def mm_block_free(lhsT, rhs, TILES_M=2, TILES_N=2):
    K, M, N, TK, TM, TN = _tiles(lhsT, rhs)
    BM, BN = TM * TILES_M, TN * TILES_N
    assert M % BM == 0 and N % BN == 0
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for mb in nl.affine_range(M // BM):
        a_blk = []
        for i in nl.affine_range(TILES_M):
            col = []
            m0 = mb * BM + i * TM
            for k in nl.affine_range(K // TK):
                a = nl.ndarray((TK, TM), dtype=lhsT.dtype, buffer=nl.sbuf)
                nisa.dma_copy(dst=a, src=lhsT[k * TK:(k + 1) * TK, m0:m0 + TM])
                col.append(a)
            a_blk.append(col)
        for nb in nl.affine_range(N // BN):
            b_blk = []
            for j in nl.affine_range(TILES_N):
                col = []
                n0 = nb * BN + j * TN
                for k in nl.affine_range(K // TK):
                    b = nl.ndarray((TK, TN), dtype=rhs.dtype, buffer=nl.sbuf)
                    nisa.dma_copy(dst=b, src=rhs[k * TK:(k + 1) * TK, n0:n0 + TN])
                    col.append(b)
                b_blk.append(col)
            for i in nl.affine_range(TILES_M):
                for j in nl.affine_range(TILES_N):
                    acc = nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.psum)
                    for k in nl.affine_range(K // TK):
                        nisa.nc_matmul(dst=acc, stationary=a_blk[i][k], moving=b_blk[j][k])
                    res = nl.ndarray((TM, TN), dtype=result.dtype, buffer=nl.sbuf)
                    nisa.tensor_copy(dst=res, src=acc)
                    m0, n0 = mb * BM + i * TM, nb * BN + j * TN
                    nisa.dma_copy(dst=result[m0:m0 + TM, n0:n0 + TN], src=res)
    return result


@nki.jit
def mm_blocked(lhsT, rhs, TILES_M=16, TILES_N=2, TILES_K=8):
    K, M, N, TK, TM, TN = _tiles(lhsT, rhs)
    BM, BN, BK = TM * TILES_M, TN * TILES_N, TK * TILES_K
    assert M % BM == 0 and N % BN == 0 and K % BK == 0
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    NBM, NBN, NBK = M // BM, N // BN, K // BK
    # long-lived SBUF buffers, allocated once and refilled: fp32 accumulators for one N block of the
    # whole M range, one rhs block and one lhsT block (k-tile index on a free axis)
    acc = nl.ndarray((TM, NBM * TILES_M, BN), dtype=nl.float32, buffer=nl.sbuf)
    b_blk = nl.ndarray((TK, TILES_K, BN), dtype=rhs.dtype, buffer=nl.sbuf)
    a_blk = nl.ndarray((TK, TILES_K, BM), dtype=lhsT.dtype, buffer=nl.sbuf)
    out_row = nl.ndarray((TM, BN), dtype=result.dtype, buffer=nl.sbuf)
    for nb in nl.affine_range(NBN):
        nisa.memset(dst=acc, value=0.0)
        for kb in nl.sequential_range(NBK):
            # b_blk[p, t, j] = rhs[kb*BK + t*TK + p, nb*BN + j]: one DMA for the whole block
            nisa.dma_copy(dst=b_blk, src=rhs.ap(pattern=[[N, TK], [TK * N, TILES_K], [1, BN]],
                                                offset=kb * BK * N + nb * BN))
            for mb in nl.affine_range(NBM):
                nisa.dma_copy(dst=a_blk, src=lhsT.ap(pattern=[[M, TK], [TK * M, TILES_K], [1, BM]],
                                                     offset=kb * BK * M + mb * BM))
                for j in nl.affine_range(TILES_N):
                    for i in nl.affine_range(TILES_M):
                        ps = nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.psum)
                        for t in nl.affine_range(TILES_K):
                            nisa.nc_matmul(dst=ps, stationary=a_blk[:, t, i * TM:(i + 1) * TM],
                                           moving=b_blk[:, t, j * TN:(j + 1) * TN])
                        a_i = acc[:, mb * TILES_M + i, j * TN:(j + 1) * TN]
                        nisa.tensor_tensor(dst=a_i, data1=a_i, data2=ps, op=nl.add)
        for r in nl.affine_range(NBM * TILES_M):
            nisa.tensor_copy(dst=out_row, src=acc[:, r, :])
            nisa.dma_copy(dst=result[r * TM:(r + 1) * TM, nb * BN:(nb + 1) * BN], src=out_row)
    return result


@nki.jit
def mm_tiles_in_loops(lhsT, rhs, TILES_M=16, TILES_N=2, TILES_K=8):
    K, M, N, TK, TM, TN = _tiles(lhsT, rhs)
    BM, BN, BK = TM * TILES_M, TN * TILES_N, TK * TILES_K
    assert M % BM == 0 and N % BN == 0 and K % BK == 0
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    for nb in nl.affine_range(N // BN):
        out_tiles = []                                   # one (TM, TILES_N, TN) tile per M tile, live all K
        for _ in nl.affine_range(M // TM):
            t = nl.ndarray((TM, TILES_N, TN), dtype=result.dtype, buffer=nl.sbuf)
            nisa.memset(dst=t, value=0.0)
            out_tiles.append(t)
        for kb in nl.sequential_range(K // BK):
            b_blk = nl.ndarray((TK, TILES_K, BN), dtype=rhs.dtype, buffer=nl.sbuf)
            for t in range(TILES_K):
                r0 = kb * BK + t * TK
                nisa.dma_copy(dst=b_blk[:, t, :], src=rhs[r0:r0 + TK, nb * BN:(nb + 1) * BN])
            for mb in nl.affine_range(M // BM):
                a_blk = nl.ndarray((TK, TILES_K, BM), dtype=lhsT.dtype, buffer=nl.sbuf)
                for t in range(TILES_K):
                    r0 = kb * BK + t * TK
                    nisa.dma_copy(dst=a_blk[:, t, :], src=lhsT[r0:r0 + TK, mb * BM:(mb + 1) * BM])
                for i in nl.affine_range(TILES_M):
                    for j in nl.affine_range(TILES_N):
                        ps = nl.ndarray((TM, TN), dtype=nl.float32, buffer=nl.psum)
                        for t in nl.affine_range(TILES_K):
                            nisa.nc_matmul(dst=ps, stationary=a_blk[:, t, i * TM:(i + 1) * TM],
                                           moving=b_blk[:, t, j * TN:(j + 1) * TN])
                        dst = out_tiles[mb * TILES_M + i][:, j, :]
                        nisa.tensor_tensor(dst=dst, data1=dst, data2=ps, op=nl.add)
        for r, t in enumerate(out_tiles):
            nisa.dma_copy(dst=result[r * TM:(r + 1) * TM, nb * BN:(nb + 1) * BN], src=t.reshape((TM, BN)))
    return result


@nki.jit
def mm_psum_banks(lhsT, rhs, cross_banks=False):
    """One 128-row output stripe accumulated in ONE PSUM tile of N/512 banks (K tiles accumulate in
    place); every matmul writes within a single bank (``cross_banks=True`` starts the writes mid-bank,
    so 512 columns span two banks, which must be refused)."""
    K, M, N, TK, TM, TN = _tiles(lhsT, rhs)
    assert M == TM and N * 4 <= 8 * 2048
    result = nl.ndarray((M, N), dtype=lhsT.dtype, buffer=nl.shared_hbm)
    acc = nl.ndarray((M, N), dtype=nl.float32, buffer=nl.psum)        # N/512 consecutive banks
    for k in nl.affine_range(K // TK):
        a = nl.ndarray((TK, M), dtype=lhsT.dtype, buffer=nl.sbuf)
        b = nl.ndarray((TK, N), dtype=rhs.dtype, buffer=nl.sbuf)
        nisa.dma_copy(dst=a, src=lhsT[k * TK:(k + 1) * TK, :])
        nisa.dma_copy(dst=b, src=rhs[k * TK:(k + 1) * TK, :])
        for n0 in range(0, N, TN):
            # cross_banks: 512 columns starting mid-bank span two banks
            c0 = n0 + TN // 2 if (cross_banks and n0 + TN // 2 + TN <= N) else n0
            nisa.nc_matmul(dst=acc[:, c0:c0 + TN], stationary=a, moving=b[:, c0:c0 + TN])
    res = nl.ndarray((M, N), dtype=result.dtype, buffer=nl.sbuf)
    nisa.tensor_copy(dst=res, src=acc)                                 # all banks evicted at once
    nisa.dma_copy(dst=result, src=res)
    return result


VARIANTS = {"tiled": mm_tiled, "hoisted": mm_hoisted, "block_free": mm_block_free, "blocked": mm_blocked}
