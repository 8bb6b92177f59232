"""Optional fused kernels (numba) for the KPU layer: the batch-norm stage and the activation
lookup in one pass (and the depthwise taps too), serial and GIL-free: the caller runs them on
row bands in parallel.

Same integer arithmetic as the numpy path in kpu.py (int64, arithmetic shifts, the same step
table), so results are identical bit for bit; `tests/test_kpu_stages.py` compares both paths.
Without numba (or with TL2K210_NO_NUMBA=1) the numpy path runs.
"""
from __future__ import annotations

import os

import numpy as np

try:  # pragma: no cover - depends on the environment
    if os.environ.get("TL2K210_NO_NUMBA"):
        raise ImportError
    from numba import njit
except ImportError:  # pragma: no cover
    njit = None


def available() -> bool:
    return njit is not None


if njit is not None:
    # Serial kernels that release the GIL: PreparedConv runs them on row bands in its own
    # thread pool (one level of parallelism, no nested numba/BLAS threads).
    @njit(nogil=True, cache=True, inline="always")
    def _look(u, pages, fine, q):  # pragma: no cover (compiled)
        """kpu.StepTable.shifted for one clipped u = V - lo (flat when q == 0, else paged)."""
        if q == 0:
            return fine[u]
        page = np.int64(pages[u >> q])
        if page < 256:          # a constant bucket: the byte itself
            return np.uint8(page)
        return fine[((page - 256) << q) + (u & ((1 << q) - 1))]

    @njit(nogil=True, cache=True, inline="always")
    def _piece(u, ym, off, b, sh, mask, half):  # pragma: no cover (compiled)
        """kpu.act_pieces' activation of one clipped u = V - lo on the piece of slope ym, offset
        off and bias b: the reference's int64 arithmetic (carry_shift_nncase02 by sh, with
        mask = 2^sh - 1 and half = 2^(sh-1)), no table."""
        t = u * ym - off
        q = t >> sh
        f = t & mask
        up = (f > half) | ((f == half) & ((q & 1) == 1))
        return np.uint8(min(max(q + (((t >> 63) | 1) & -np.int64(up)) + b, 0), 255))

    # The activation of a plane of clipped indices, one loop per form. Each form is its own
    # function, dispatched once per plane (_look_rows), with the pieces' parameters read into
    # locals before the loops: one function holding every form's loop, called a row at a time,
    # ran about 4x slower on the short rows of a small map (80 ns more per call, whether
    # numba inlines it or not).
    @njit(nogil=True, cache=True)
    def _rows_piece1(buf, wp, pc, out):  # pragma: no cover (compiled)
        ym, off, b, sh, mask, half = pc[4], pc[8], pc[12], pc[16], pc[17], pc[18]
        w = out.shape[1]
        for y in range(out.shape[0]):
            src, orow = buf[y * wp:y * wp + w], out[y]   # slices: indexing buf[y * wp + x]
            for x in range(w):                           # would not vectorise (numba's
                orow[x] = _piece(np.int64(src[x]), ym, off, b, sh, mask, half)   # wrap-around)

    @njit(nogil=True, cache=True)
    def _rows_piece2(buf, wp, pc, out):  # pragma: no cover (compiled)
        s1, ym0, ym1, off0, off1, b0, b1 = pc[1], pc[4], pc[5], pc[8], pc[9], pc[12], pc[13]
        sh, mask, half = pc[16], pc[17], pc[18]
        w = out.shape[1]
        for y in range(out.shape[0]):
            src, orow = buf[y * wp:y * wp + w], out[y]
            for x in range(w):
                u = np.int64(src[x])
                g = u >= s1
                orow[x] = _piece(u, ym1 if g else ym0, off1 if g else off0, b1 if g else b0,
                                 sh, mask, half)

    @njit(nogil=True, cache=True)
    def _rows_piece4(buf, wp, pc, out):  # pragma: no cover (compiled)
        s1, s2, s3 = pc[1], pc[2], pc[3]
        ym0, ym1, ym2, ym3 = pc[4], pc[5], pc[6], pc[7]
        off0, off1, off2, off3 = pc[8], pc[9], pc[10], pc[11]
        b0, b1, b2, b3 = pc[12], pc[13], pc[14], pc[15]
        sh, mask, half = pc[16], pc[17], pc[18]
        w = out.shape[1]
        for y in range(out.shape[0]):
            src, orow = buf[y * wp:y * wp + w], out[y]
            for x in range(w):
                u = np.int64(src[x])
                g1, g2, g3 = u >= s1, u >= s2, u >= s3
                ym = ym3 if g3 else (ym2 if g2 else (ym1 if g1 else ym0))
                off = off3 if g3 else (off2 if g2 else (off1 if g1 else off0))
                b = b3 if g3 else (b2 if g2 else (b1 if g1 else b0))
                orow[x] = _piece(u, ym, off, b, sh, mask, half)

    @njit(nogil=True, cache=True)
    def _rows_table(buf, wp, pages, fine, q, out):  # pragma: no cover (compiled)
        w = out.shape[1]
        for y in range(out.shape[0]):
            src, orow = buf[y * wp:y * wp + w], out[y]
            for x in range(w):
                orow[x] = _look(src[x], pages, fine, q)

    @njit(nogil=True, cache=True)
    def _look_rows(buf, wp, pages, fine, q, pc, out):  # pragma: no cover (compiled)
        """out[y, x] = the activation of the clipped index buf[y * wp + x] for one channel's
        (H, W) output, from a plane of row stride wp: by the piecewise arithmetic of
        kpu.act_pieces where pc[0] (its piece count) > 0 (branch-free selects pick the piece:
        vectorises), else by the step table (a gather)."""
        if pc[0] == 1:
            _rows_piece1(buf, wp, pc, out)
        elif pc[0] == 2:
            _rows_piece2(buf, wp, pc, out)
        elif pc[0] > 2:
            _rows_piece4(buf, wp, pc, out)
        else:
            _rows_table(buf, wp, pages, fine, q, out)

    @njit(nogil=True, cache=True, inline="always")
    def _warm(pages, fine, q, pc, buf):  # pragma: no cover (compiled)
        """Read one byte per cache line of the lookup table (and its page index) in order, so
        the lookups that follow find it in cache: a layer's table (up to 1 MiB) is cold when
        the layer starts, and the prefetcher streams an in-order pass in a few microseconds
        where scattered lookups miss line by line (about 3x a warm table's time on a
        300 KB table). The sum goes to buf[0] (scratch the caller overwrites) so the reads
        stay."""
        if pc[0] > 0:     # the arithmetic needs no table
            return
        t = 0
        for i in range(0, fine.size, 64):
            t += fine[i]
        if q:
            for i in range(0, pages.size, 32):
                t += pages[i]
        buf[0] = t

    @njit(nogil=True, cache=True, inline="always")
    def _bn_idx(vals, n, c, m, s, a, top, buf):  # pragma: no cover (compiled)
        """buf[p] = the clipped table index ((vals[p] + c) * m >> s) + a for p < n."""
        for p in range(n):
            buf[p] = min(max((((np.int64(vals[p]) + c) * m) >> s) + a, 0), top)

    @njit(nogil=True, cache=True)
    def bn_lut(acc, const, mul, shift, add_lo, pages, fine, q, top, pc, buf, out):  # pragma: no cover (compiled)
        """out[o, p] = table(((acc[o, p] + const[o]) * mul[o] >> shift[o]) + add_lo[o]);
        acc holds exact integers (float32/float64 BLAS output); buf: one row of scratch
        (int32 when top < 2^31, else int64). A row in two passes: the integer arithmetic
        (vectorises) into buf, then the activation (_look_rows); one fused loop would not
        vectorise and runs about 4x slower."""
        _warm(pages, fine, q, pc, buf)
        n = out.shape[1]
        for o in range(acc.shape[0]):
            _bn_idx(acc[o], n, const[o], mul[o], shift[o], add_lo[o], top, buf)
            _look_rows(buf, n, pages, fine, q, pc, out[o:o + 1])

    @njit(nogil=True, cache=True, inline="always")
    def _fold(vals, r, n, lo):  # pragma: no cover (compiled)
        """vals[:n] = min (lo) or max of vals[:n] and r[:n]."""
        if lo:
            for x in range(n):
                vals[x] = min(vals[x], r[x])
        else:
            for x in range(n):
                vals[x] = max(vals[x], r[x])

    @njit(nogil=True, cache=True)
    def max_bn_lut(acc, k, s, neg, const, mul, shift, add_lo, pages, fine, q, top, pc, vals,
                   pooled, buf, out):  # pragma: no cover (compiled)
        """A k x k max pool at stride s over the sums acc (C, rows, W), then bn_lut on the pooled
        values only: out[o, y, x] = table(BN(max, or min where neg[o], of the window's sums)).
        The caller proved table(BN(.)) monotone per channel (kpu.PreparedConv), so the pool of
        the looked-up bytes equals the lookup of the pooled sums. Windows past the last row or
        column (stride 1) take only their in-bounds sums (the KPU pads the uint8 output with 0,
        which no activation byte is below). vals: one input row of acc's dtype; pooled: one
        output plane of it; buf: one output plane of scratch."""
        rows, w, oh, ow = acc.shape[1], acc.shape[2], out.shape[1], out.shape[2]
        _warm(pages, fine, q, pc, buf)
        for o in range(acc.shape[0]):
            lo = neg[o] != 0
            for oy in range(oh):
                y0 = oy * s
                vals[:] = acc[o, y0]
                for dy in range(1, min(k, rows - y0)):
                    _fold(vals, acc[o, y0 + dy], w, lo)
                prow = pooled[oy * ow:(oy + 1) * ow]
                for ox in range(ow):
                    prow[ox] = vals[ox * s]
                for dx in range(1, k):
                    _fold(prow, vals[dx::s], min(ow, (w - dx + s - 1) // s), lo)
            _bn_idx(pooled, oh * ow, const[o], mul[o], shift[o], add_lo[o], top, buf)
            _look_rows(buf, ow, pages, fine, q, pc, out[o])

    @njit(nogil=True, cache=True)
    def max2_bn_lut(pairs, neg, const, mul, shift, add_lo, pages, fine, q, top, pc, buf,
                    out):  # pragma: no cover (compiled)
        """max_bn_lut for the 2 x 2 pool at stride 2 over int32 sums, read as int64 pairs
        (C, rows, W/2): each int64 holds one window row's two sums, taken apart by shifts (the
        low one sign-extended by << 32 >> 32), which vectorises where the strided max does
        not (about 3x). The BN arithmetic runs in the same pass, then the lookups.
        buf: one output plane of scratch."""
        _warm(pages, fine, q, pc, buf)
        n = out.shape[2]
        for o in range(pairs.shape[0]):
            lo = neg[o] != 0
            c, m, sh, a = const[o], mul[o], shift[o], add_lo[o]
            for oy in range(out.shape[1]):
                r0, r1, b = pairs[o, 2 * oy], pairs[o, 2 * oy + 1], oy * n
                if lo:
                    for x in range(n):
                        u, d = r0[x], r1[x]
                        v = min(min((u << 32) >> 32, u >> 32), min((d << 32) >> 32, d >> 32))
                        buf[b + x] = min(max((((v + c) * m) >> sh) + a, 0), top)
                else:
                    for x in range(n):
                        u, d = r0[x], r1[x]
                        v = max(max((u << 32) >> 32, u >> 32), max((d << 32) >> 32, d >> 32))
                        buf[b + x] = min(max((((v + c) * m) >> sh) + a, 0), top)
            _look_rows(buf, n, pages, fine, q, pc, out[o])

    @njit(nogil=True, cache=True)
    def im2col_s8(xp, h, w, s, k, out):  # pragma: no cover (compiled)
        """out[(c·k + ky)·k + kx, y·w + x] = xp[c, y·s + ky, x·s + kx] XOR 0x80 (x − 128 as
        int8 bits): the k x k windows starting every s rows and columns of the padded uint8
        map xp (C, rows, cols), one row per tap, for intconv.ConvSums' uint8 x int8 product."""
        for c in range(xp.shape[0]):
            for ky in range(k):
                for kx in range(k):
                    orow = out[(c * k + ky) * k + kx]
                    for y in range(h):
                        src, o = xp[c, y * s + ky], orow[y * w:(y + 1) * w]
                        if s == 1:
                            seg = src[kx:kx + w]
                            for x in range(w):
                                o[x] = seg[x] ^ 0x80
                        else:
                            for x in range(w):
                                o[x] = src[x * s + kx] ^ 0x80

    @njit(nogil=True, cache=True)
    def fold_box(y, z, offset):  # pragma: no cover (compiled)
        """y[o, p] += offset[o] − z·y[−1, p] for every row but the last (intconv.ConvSums'
        uint8 x int8 sums back to the KPU's, int32 modulo 2^32)."""
        box = y[y.shape[0] - 1]
        for o in range(y.shape[0] - 1):
            row, ko = y[o], offset[o]
            for p in range(row.size):
                row[p] = np.int32(row[p] + ko - z * box[p])

    @njit(nogil=True, cache=True)
    def _step(v, starts, values):  # pragma: no cover (compiled)
        """values[j] for the last j with starts[j] <= v (starts[0] <= every reachable v)."""
        lo, hi = 0, starts.size - 1
        while lo < hi:
            mid = (lo + hi + 1) >> 1
            if starts[mid] <= v:
                lo = mid
            else:
                hi = mid - 1
        return values[lo]

    @njit(nogil=True, cache=True)
    def bn_steps(acc, const, mul, shift, add, starts, values, out):  # pragma: no cover (compiled)
        """Like bn_lut for an activation kept as breakpoints (its V span is too wide to tabulate)."""
        for o in range(acc.shape[0]):
            c, m, s, a = const[o], mul[o], shift[o], add[o]
            row, orow = acc[o], out[o]
            for p in range(row.size):
                orow[p] = _step((((np.int64(row[p]) + c) * m) >> s) + a, starts, values)

    @njit(nogil=True, cache=True)
    def pad1(x, pv, out):  # pragma: no cover (compiled)
        """out (C, H+2, W+2) = x (C, H, W) with a 1-pixel border of pv, in out's dtype (uint8,
        or float32 for dw_bn_lut: its taps then read each value once converted, not nine
        times): one pass, where numpy's copy and four border writes took about 2x."""
        h, w = x.shape[1], x.shape[2]
        for c in range(x.shape[0]):
            oc, xc = out[c], x[c]
            oc[0, :] = pv
            oc[h + 1, :] = pv
            for y in range(h):
                orow, xrow = oc[y + 1], xc[y]
                orow[0] = pv
                orow[w + 1] = pv
                for i in range(w):
                    orow[i + 1] = xrow[i]

    @njit(nogil=True, cache=True, inline="always")
    def _taps3(xf, b0, wp, n, wc, acc):  # pragma: no cover (compiled)
        """acc[:n] = the 3 x 3 taps of the flat padded plane at b0 (rows of wp) with weights
        wc[0..8], all nine in one pass (1.5x nine passes: acc is written once). Any order of
        the sum is exact: its partial sums are integers below the bound dw_bn_lut states."""
        s0, s1, s2 = xf[b0:b0 + n], xf[b0 + 1:b0 + 1 + n], xf[b0 + 2:b0 + 2 + n]
        b1, b2 = b0 + wp, b0 + 2 * wp
        s3, s4, s5 = xf[b1:b1 + n], xf[b1 + 1:b1 + 1 + n], xf[b1 + 2:b1 + 2 + n]
        s6, s7, s8 = xf[b2:b2 + n], xf[b2 + 1:b2 + 1 + n], xf[b2 + 2:b2 + 2 + n]
        w0, w1, w2, w3, w4 = wc[0], wc[1], wc[2], wc[3], wc[4]
        w5, w6, w7, w8 = wc[5], wc[6], wc[7], wc[8]
        for i in range(n):
            acc[i] = (s0[i] * w0 + s1[i] * w1 + s2[i] * w2 + s3[i] * w3 + s4[i] * w4
                      + s5[i] * w5 + s6[i] * w6 + s7[i] * w7 + s8[i] * w8)

    @njit(nogil=True, cache=True)
    def dw3_bn_lut(x, pv, r0, w, const, mul, shift, add_lo, pages, fine, q, top, pc, buf,
                   out):  # pragma: no cover (compiled)
        """dw_bn_lut for a 3 x 3 depthwise layer whose Σx term folded into its weights, on the
        unpadded uint8 map x (C, H, W), output rows r0..: each channel's rows r0 − 1 .. r0 + h
        are padded with pv and converted to w's dtype in a scratch plane that stays in cache,
        where a padded copy of the whole map (pad1) went out to memory and back (about 3 % of
        a 320 x 240 face detector's frame). The same sums, exact as dw_bn_lut states."""
        hh, ww = x.shape[1], x.shape[2]
        h, wd = out.shape[1], out.shape[2]
        wp = ww + 2
        sp = np.empty((h + 2) * wp, w.dtype)
        n = (h - 1) * wp + wd
        acc = np.empty(n, w.dtype)
        _warm(pages, fine, q, pc, buf)
        for c in range(out.shape[0]):
            xc = x[c]
            for j in range(h + 2):
                yy = r0 - 1 + j
                row = sp[j * wp:(j + 1) * wp]
                if yy < 0 or yy >= hh:
                    row[:] = pv
                else:
                    row[0] = pv
                    row[wp - 1] = pv
                    src, dst = xc[yy], row[1:ww + 1]
                    for i in range(ww):
                        dst[i] = src[i]
            _taps3(sp, 0, wp, n, w[c], acc)
            _bn_idx(acc, n, const[c], mul[c], shift[c], add_lo[c], top, buf)
            _look_rows(buf, wp, pages, fine, q, pc, out[c])

    @njit(nogil=True, cache=True)
    def dw_bn_lut(xf, plane, wp, r0, w, k, arg_x, shr_x, x_exact, const, mul, shift, add_lo, pages,
                  fine, q, top, pc, buf, out):  # pragma: no cover
        """Depthwise k×k taps over the flattened padded map xf (C planes of ``plane`` values, rows
        of wp), output rows r0.. (weights already hold the folded Σx term when x_exact), then the
        same BN arithmetic as bn_lut, and the lookups straight into the output rows. Each tap is
        one pass along the flat channel plane (the two columns past each row's end are computed
        and dropped): a long contiguous loop over a
        slice, which LLVM vectorises (indexing xf[b + i] directly does not: numba's negative-index
        wrap-around hides the stride), about 10x the per-row loops. The sums are exact in w's
        dtype: float32 when the caller proved every window sum an integer below 2^24, else
        float64 (below 2^53). buf: one plane of scratch."""
        h, wd = out.shape[1], out.shape[2]
        n = (h - 1) * wp + wd
        _warm(pages, fine, q, pc, buf)
        acc = np.empty(n, w.dtype)
        box = np.empty(n if not x_exact else 1, w.dtype)
        t = np.empty(n if not x_exact else 1, np.int64)
        for c in range(out.shape[0]):
            b0 = c * plane + r0 * wp
            if k == 3 and x_exact:
                _taps3(xf, b0, wp, n, w[c], acc)
                _bn_idx(acc, n, const[c], mul[c], shift[c], add_lo[c], top, buf)
                _look_rows(buf, wp, pages, fine, q, pc, out[c])
                continue
            src = xf[b0:b0 + n]
            wt = w[c, 0]
            for i in range(n):
                acc[i] = src[i] * wt
            if not x_exact:
                for i in range(n):
                    box[i] = src[i]
            for tap in range(1, k * k):
                wt = w[c, tap]
                b = b0 + (tap // k) * wp + tap % k
                src = xf[b:b + n]
                for i in range(n):
                    acc[i] += src[i] * wt
                if not x_exact:
                    for i in range(n):
                        box[i] += src[i]
            if x_exact:
                _bn_idx(acc, n, const[c], mul[c], shift[c], add_lo[c], top, buf)
            else:
                for i in range(n):
                    t[i] = np.int64(acc[i]) + ((arg_x * np.int64(box[i])) >> shr_x)
                _bn_idx(t, n, const[c], mul[c], shift[c], add_lo[c], top, buf)
            _look_rows(buf, wp, pages, fine, q, pc, out[c])
