"""Tiles held as tuples of slices (slice j: element j of each of a tile's blocks, all slices in one layout, so a
block's elements sit in one thread): their load, the RHT on them and their in-thread join into one tensor.

``rht16`` computes ``reference.hadamard.rht_ref``'s order bit for bit: the signs, the fast Walsh-Hadamard transform's
four butterfly stages, the exact ·1/4 — four additions per element, each rounded once, against the sixteen of a
row of H16. On slices every butterfly is elementwise: no value crosses threads."""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def rht16(xs, m_ptr, g: tl.constexpr):
    """Slices ``xs[g:g+16]`` times H16·diag(signs)/4 (``m_ptr``: the signs): u_j = s_j·x_j + 0 (no -0), then for
    h = 1, 2, 4, 8 the pairs (u_i, u_{i+h}) with i & h == 0 become (u_i + u_{i+h}, u_i - u_{i+h}), then
    y_i = u_i · 1/4."""
    us = ()
    for j in tl.static_range(16):
        us = us + (xs[g + j] * tl.load(m_ptr + j) + 0.0,)  # FMA-safe: ±x_j exact; + 0 makes a zero +0
    for stage in tl.static_range(4):
        vs = ()
        for i in tl.static_range(16):
            if (i >> stage) & 1 == 0:
                vs = vs + (us[i] + us[i + (1 << stage)],)  # FMA-safe: products only at stage 0, s_j·x_j exact
            else:
                vs = vs + (us[i - (1 << stage)] - us[i],)  # FMA-safe: as above
        us = vs
    ys = ()
    for i in tl.static_range(16):
        ys = ys + (us[i] * 0.25,)
    return ys


@triton.jit
def join_slices(xs, n: tl.constexpr):
    """[BR, NB, n] of the first n slices of ``xs`` (n = 1, 2, 4, ..., 32) in their order, joined in-thread: the even
    slices' join beside the odd ones', each made the same way. One function per size, not a recursion: Triton 3.4
    (torch 2.8's) hashes a self-calling jit function forever, a RecursionError before any kernel calling it
    compiles."""
    if n == 32:
        return _join32(xs, 0, 1)
    elif n == 16:
        return _join16(xs, 0, 1)
    elif n == 8:
        return _join8(xs, 0, 1)
    elif n == 4:
        return _join4(xs, 0, 1)
    elif n == 2:
        return _join2(xs, 0, 1)
    else:
        tl.static_assert(n == 1, "join_slices joins 1, 2, 4, 8, 16 or 32 slices")
        return tl.expand_dims(xs[0], 2)


@triton.jit
def _interleave(even, odd):
    """[BR, NB, 2m] of two [BR, NB, m] joins, element 2i from ``even``'s i, 2i + 1 from ``odd``'s."""
    j = tl.join(even, odd)
    return tl.reshape(j, (j.shape[0], j.shape[1], 2 * j.shape[2]))


@triton.jit
def _join2(xs, lo: tl.constexpr, step: tl.constexpr):
    """Slices ``xs[lo]``, ``xs[lo + step]`` as [BR, NB, 2]."""
    return _interleave(tl.expand_dims(xs[lo], 2), tl.expand_dims(xs[lo + step], 2))


@triton.jit
def _join4(xs, lo: tl.constexpr, step: tl.constexpr):
    return _interleave(_join2(xs, lo, 2 * step), _join2(xs, lo + step, 2 * step))


@triton.jit
def _join8(xs, lo: tl.constexpr, step: tl.constexpr):
    return _interleave(_join4(xs, lo, 2 * step), _join4(xs, lo + step, 2 * step))


@triton.jit
def _join16(xs, lo: tl.constexpr, step: tl.constexpr):
    return _interleave(_join8(xs, lo, 2 * step), _join8(xs, lo + step, 2 * step))


@triton.jit
def _join32(xs, lo: tl.constexpr, step: tl.constexpr):
    return _interleave(_join16(xs, lo, 2 * step), _join16(xs, lo + step, 2 * step))


@triton.jit
def load_slices(x_ptr, m_ptr, rows, c0, R, K, s_r, s_k, W: tl.constexpr, RHT: tl.constexpr):
    """W fp32 slices [BR, NB] of the (R, K) view: slice j holds column ``c0 + j`` of rows ``rows`` (``c0``: the
    blocks' first columns, [NB]), zeros outside the view; with RHT each 16 of them transformed as ``rht16``
    does."""
    sk = tl.cast(s_k, tl.int64)  # a cast, not .to: a launch may pass s_k = 1 as a constexpr
    base = x_ptr + rows.to(tl.int64)[:, None] * s_r + c0.to(tl.int64)[None, :] * sk
    xs = ()
    for j in tl.static_range(W):
        mask = (rows < R)[:, None] & (c0 + j < K)[None, :]
        xs = xs + (tl.load(base + j * sk, mask=mask, other=0.0).to(tl.float32),)
    if RHT:
        ys = ()
        for g in tl.static_range(W // 16):
            ys = ys + rht16(xs, m_ptr, g * 16)
        xs = ys
    return xs
