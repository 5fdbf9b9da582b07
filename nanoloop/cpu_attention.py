"""
Causal softmax attention for the CPU grids: a small C kernel (fp32, any head dim), forward and backward, that
replaces PyTorch's CPU flash-attention kernel where that kernel is slowest, at the head dim 8 of the d = 8-48
CPU runs. Same math as F.scaled_dot_product_attention(q, k, v, is_causal=True); the outputs and gradients
agree with it to fp32 rounding (tests/test_model.py). GPU runs never use it (model.attention_backend).

Why a kernel of our own: at head dim 8 every matrix product of attention is tiny (a 128 x 8 by 8 x 128 per
(batch, head)), so the flash kernel's blocked GEMM calls cost more in overhead than in arithmetic, and its
backward takes ~3x its forward; at d = 48 the two were half of a training step (dev/bench_train.py
--attention measures both kernels side by side). Here the work is laid out for the vector units instead: 16
queries side by side (a "tile"), one key at a time, so that every inner loop runs over the 16 lanes of one
vector register whatever the head dim, and the softmax's exp is a polynomial the compiler vectorises. The
backward recomputes the probabilities from the forward's log-sum-exp, as FlashAttention does (Dao et al.
2022, Alg. 2; Dao 2023, Alg. 2 for delta = rowsum(dO * O)), instead of storing the T x T matrix, and makes
two passes, dq over tiles of queries and dk, dv over tiles of keys, so that no sum runs across lanes.

The C source below is compiled once per machine and source (-march=native) with the system's C compiler
into a cache folder and loaded with ctypes, which releases the GIL: the (batch, head) pairs are split over
torch.get_num_threads() Python threads, and the result does not depend on the split. With no working
compiler, available() is False (one line on stderr) and model.py keeps PyTorch's kernel.

    from nanoloop.cpu_attention import available, causal_attention
    y = causal_attention(q, k, v)   # (B, T, H, D) fp32 CPU tensors in, (B, T, H, D) out
"""
import ctypes
import functools
import hashlib
import os
import platform
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

C_SOURCE = r"""
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* A tile is LANES queries (or keys) side by side: every inner loop below runs over a tile's lanes, 16 floats
   that the compiler turns into one vector operation, whatever the head dim D. */
#define LANES 16

/* One (batch, head) pair of the (B, T, H, D) contiguous tensors: its row t is at q + t * row_stride, and lse
   and delta (the backward's rowsum(dO * O)) hold its T queries' values. */
typedef struct {
    const float *q, *k, *v, *out, *dout, *lse;
    float *delta;
    int T, D, row_stride;
    float scale;  /* 1 / sqrt(D) */
} Pair;

static Pair pair_at(int pair, const float *q, const float *k, const float *v, const float *out,
                    const float *dout, const float *lse, int T, int H, int D) {
    long base = (long)(pair / H) * T * H * D + (long)(pair % H) * D;
    Pair a = {q + base, k + base, v + base, out ? out + base : 0, dout ? dout + base : 0, lse + (long)pair * T,
              0, T, D, H * D, 1.0f / sqrtf((float)D)};
    return a;
}

/* exp(x) for x <= 0 (larger x are clamped to 0), vectorisable (no libm call): Cephes' expf, x = n ln2 + r with
   |r| <= ln2/2, a degree-5 polynomial for exp(r), 2^n from the exponent bits. About 1 ulp; 0 below -87. */
static inline float exp_nonpositive(float x) {
    x = x < 0.0f ? x : 0.0f;
    float n = floorf(x * 1.44269504f + 0.5f);
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.9875691500e-4f;
    p = p * r + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    union { int bits; float value; } two_n = { .bits = ((int)n + 127) << 23 };  /* C's type pun */
    return x < -87.0f ? 0.0f : p * two_n.value;
}

/* tile[d * LANES + l] = factor * rows[(first + l) * row_stride + d]; 0 for lanes past row T */
static void load_tile(float *tile, const float *rows, int first, const Pair *a, float factor) {
    for (int l = 0; l < LANES; l++)
        for (int d = 0; d < a->D; d++)
            tile[d * LANES + l] = first + l < a->T ? factor * rows[(long)(first + l) * a->row_stride + d] : 0.0f;
}

/* rows[(first + l) * row_stride + d] = factor * tile[d][l] for the lanes before row T */
static void store_tile(float *rows, const float *tile, int first, const Pair *a, float factor) {
    for (int l = 0; l < LANES && first + l < a->T; l++)
        for (int d = 0; d < a->D; d++)
            rows[(long)(first + l) * a->row_stride + d] = factor * tile[d * LANES + l];
}

/* dot[l] = sum_d tile[d][l] * vector[d]: one score (or one dP entry) per lane */
static void dot_lanes(float *restrict dot, const float *restrict tile, const float *restrict vector, int D) {
    for (int l = 0; l < LANES; l++) dot[l] = 0.0f;
    for (int d = 0; d < D; d++) {
        #pragma omp simd
        for (int l = 0; l < LANES; l++) dot[l] += tile[d * LANES + l] * vector[d];
    }
}

/* acc[d][l] += weight[l] * vector[d] */
static void add_outer(float *restrict acc, const float *restrict weight, const float *restrict vector, int D) {
    for (int d = 0; d < D; d++) {
        #pragma omp simd
        for (int l = 0; l < LANES; l++) acc[d * LANES + l] += weight[l] * vector[d];
    }
}

/* The queries i0 .. i0 + LANES - 1 of one pair: their scores and each one's max over the keys it sees
   (causal: key j <= query i), then the exponentials, their sum and the weighted values; out and lse. */
static void forward_tile(const Pair *a, int i0, float *out, float *lse, float *q_tile, float *scores, float *acc) {
    float max_score[LANES], total[LANES], p[LANES];
    int keys = i0 + LANES < a->T ? i0 + LANES : a->T;
    load_tile(q_tile, a->q, i0, a, a->scale);
    for (int l = 0; l < LANES; l++) {
        max_score[l] = -INFINITY;
        total[l] = 0.0f;
    }
    for (int j = 0; j < keys; j++) {
        float *s = scores + j * LANES;
        dot_lanes(s, q_tile, a->k + (long)j * a->row_stride, a->D);
        #pragma omp simd
        for (int l = 0; l < LANES; l++) max_score[l] = j <= i0 + l && s[l] > max_score[l] ? s[l] : max_score[l];
    }
    memset(acc, 0, sizeof(float) * a->D * LANES);
    for (int j = 0; j < keys; j++) {
        #pragma omp simd
        for (int l = 0; l < LANES; l++) {
            float e = exp_nonpositive(scores[j * LANES + l] - max_score[l]);  /* computed, then masked: vectorises */
            p[l] = j <= i0 + l ? e : 0.0f;
            total[l] += p[l];
        }
        add_outer(acc, p, a->v + (long)j * a->row_stride, a->D);
    }
    for (int l = 0; l < LANES && i0 + l < a->T; l++) {
        for (int d = 0; d < a->D; d++) out[(long)(i0 + l) * a->row_stride + d] = acc[d * LANES + l] / total[l];
        lse[i0 + l] = max_score[l] + logf(total[l]);
    }
}

/* dq of the queries i0 .. i0 + LANES - 1: dq_i = scale sum_j dS_ij k_j over the keys query i sees, with
   P = exp(S - lse) recomputed and dS = P (dP - delta), dP_ij = dO_i . v_j. */
static void grad_query_tile(const Pair *a, int i0, float *dq, float *q_tile, float *dout_tile, float *acc) {
    float s[LANES], dp[LANES], ds[LANES], lse[LANES], delta[LANES];
    int keys = i0 + LANES < a->T ? i0 + LANES : a->T;
    load_tile(q_tile, a->q, i0, a, a->scale);
    load_tile(dout_tile, a->dout, i0, a, 1.0f);
    for (int l = 0; l < LANES; l++) {
        lse[l] = i0 + l < a->T ? a->lse[i0 + l] : 0.0f;
        delta[l] = i0 + l < a->T ? a->delta[i0 + l] : 0.0f;
    }
    memset(acc, 0, sizeof(float) * a->D * LANES);
    for (int j = 0; j < keys; j++) {
        dot_lanes(s, q_tile, a->k + (long)j * a->row_stride, a->D);
        dot_lanes(dp, dout_tile, a->v + (long)j * a->row_stride, a->D);
        #pragma omp simd
        for (int l = 0; l < LANES; l++) {
            float e = exp_nonpositive(s[l] - lse[l]);
            ds[l] = j <= i0 + l ? e * (dp[l] - delta[l]) : 0.0f;
        }
        add_outer(acc, ds, a->k + (long)j * a->row_stride, a->D);
    }
    store_tile(dq, acc, i0, a, a->scale);
}

/* dk and dv of the keys j0 .. j0 + LANES - 1, over the queries that see them (i >= j):
   dv_j = sum_i P_ij dO_i, dk_j = scale sum_i dS_ij q_i. Lanes are keys here, so every sum runs across lanes. */
static void grad_key_tile(const Pair *a, int j0, float *dk, float *dv, float *k_tile, float *v_tile,
                          float *acc_k, float *acc_v, float *q_row) {
    float s[LANES], dp[LANES], p[LANES], ds[LANES];
    load_tile(k_tile, a->k, j0, a, 1.0f);
    load_tile(v_tile, a->v, j0, a, 1.0f);
    memset(acc_k, 0, sizeof(float) * a->D * LANES);
    memset(acc_v, 0, sizeof(float) * a->D * LANES);
    for (int i = j0; i < a->T; i++) {
        const float *q_i = a->q + (long)i * a->row_stride, *dout_i = a->dout + (long)i * a->row_stride;
        for (int d = 0; d < a->D; d++) q_row[d] = a->scale * q_i[d];
        dot_lanes(s, k_tile, q_row, a->D);
        dot_lanes(dp, v_tile, dout_i, a->D);
        #pragma omp simd
        for (int l = 0; l < LANES; l++) {
            float e = exp_nonpositive(s[l] - a->lse[i]);
            p[l] = j0 + l <= i ? e : 0.0f;
            ds[l] = p[l] * (dp[l] - a->delta[i]);
        }
        add_outer(acc_v, p, dout_i, a->D);
        add_outer(acc_k, ds, q_i, a->D);
    }
    store_tile(dv, acc_v, j0, a, 1.0f);
    store_tile(dk, acc_k, j0, a, a->scale);
}

/* Tensors (B, T, H, D) contiguous, lse (B, H, T); the pairs [first, last) of the B*H, pair = b * H + h. */
void attention_forward(const float *q, const float *k, const float *v, float *out, float *lse,
                       int T, int H, int D, int first, int last) {
    float *q_tile = malloc(sizeof(float) * D * LANES), *acc = malloc(sizeof(float) * D * LANES);
    float *scores = malloc(sizeof(float) * T * LANES);
    for (int pair = first; pair < last; pair++) {
        Pair a = pair_at(pair, q, k, v, 0, 0, lse, T, H, D);
        long offset = a.q - q;
        for (int i0 = 0; i0 < T; i0 += LANES)
            forward_tile(&a, i0, out + offset, lse + (long)pair * T, q_tile, scores, acc);
    }
    free(q_tile); free(acc); free(scores);
}

/* dq, dk, dv are written, not accumulated; layouts and pairs as attention_forward's. */
void attention_backward(const float *q, const float *k, const float *v, const float *out, const float *dout,
                        const float *lse, float *dq, float *dk, float *dv,
                        int T, int H, int D, int first, int last) {
    float *tile = malloc(sizeof(float) * D * LANES), *tile_2 = malloc(sizeof(float) * D * LANES);
    float *acc = malloc(sizeof(float) * D * LANES), *acc_2 = malloc(sizeof(float) * D * LANES);
    float *delta = malloc(sizeof(float) * T), *q_row = malloc(sizeof(float) * D);
    for (int pair = first; pair < last; pair++) {
        Pair a = pair_at(pair, q, k, v, out, dout, lse, T, H, D);
        long offset = a.q - q;
        a.delta = delta;
        for (int i = 0; i < T; i++) {  /* delta_i = rowsum(dO * O) = rowsum(P * dP), FlashAttention-2's D_i */
            const float *dout_i = a.dout + (long)i * a.row_stride, *out_i = a.out + (long)i * a.row_stride;
            delta[i] = 0.0f;
            for (int d = 0; d < D; d++) delta[i] += dout_i[d] * out_i[d];
        }
        for (int i0 = 0; i0 < T; i0 += LANES)
            grad_query_tile(&a, i0, dq + offset, tile, tile_2, acc);
        for (int j0 = 0; j0 < T; j0 += LANES)
            grad_key_tile(&a, j0, dk + offset, dv + offset, tile, tile_2, acc, acc_2, q_row);
    }
    free(tile); free(tile_2); free(acc); free(acc_2); free(delta); free(q_row);
}
"""
# -march=native: the cached library is built for this machine's vector units, so the cache key names the CPU.
# -fopenmp-simd honours the `omp simd` pragmas (vectorised reductions) without the OpenMP runtime.
CFLAGS = ["-O3", "-march=native", "-fopenmp-simd", "-fno-trapping-math", "-fPIC", "-shared"]
_library = None  # the loaded kernel, or False once building it failed


def cpu_name():
    """This CPU's model and feature flags (Linux), so a cache shared by unlike machines keeps one build each."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor()
    return "".join(sorted({line for line in lines if line.startswith(("model name", "flags"))}))


def load_library():
    """The compiled kernel (ctypes.CDLL), built on first use into $NANOLOOP_KERNEL_CACHE (default: the temp
    folder); None, with one line on stderr, when there is no C compiler or it fails."""
    global _library
    if _library is None:
        key = hashlib.sha256("\n".join([C_SOURCE, *CFLAGS, cpu_name()]).encode()).hexdigest()[:16]
        folder = Path(os.environ.get("NANOLOOP_KERNEL_CACHE", Path(tempfile.gettempdir()) / "nanoloop-kernels"))
        path = folder / f"cpu_attention_{key}.so"
        try:
            if not path.exists():
                build(path)
            _library = ctypes.CDLL(str(path))
        except (OSError, subprocess.CalledProcessError) as e:
            detail = " ".join((getattr(e, "stderr", None) or str(e)).split())[:200]  # one line
            print(f"cpu_attention: cannot build the C kernel ({detail}); using PyTorch's attention", file=sys.stderr)
            _library = False
    return _library or None


def build(path):
    """Compile C_SOURCE into path; a private temporary name first, so runs starting together never load a
    half-written library (the last rename wins, and every build is the same)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    compiler = os.environ.get("CC", "cc")
    with tempfile.TemporaryDirectory(dir=path.parent) as tmp:
        source = Path(tmp) / "cpu_attention.c"
        source.write_text(C_SOURCE)
        subprocess.run([compiler, *CFLAGS, str(source), "-o", str(Path(tmp) / path.name)], check=True,
                       capture_output=True, text=True)
        os.replace(Path(tmp) / path.name, path)


def available():
    """Whether the kernel is built and loaded here (building it on the first call)."""
    return load_library() is not None


@functools.cache
def helper_threads(count):
    """A pool of count threads, made once per count and kept: starting threads on every call cost ~0.5 ms,
    as much as the kernel itself at d = 8."""
    return ThreadPoolExecutor(count, thread_name_prefix="cpu_attention")


def over_pairs(kernel, tensors, B, T, H, D):
    """Call kernel on all B*H (batch, head) pairs, split into torch.get_num_threads() contiguous ranges that run
    in parallel, the last on this thread (each pair is independent, so the result does not depend on the split)."""
    pointers = [ctypes.c_void_p(t.data_ptr()) for t in tensors]
    pairs = B * H
    threads = max(1, min(torch.get_num_threads(), pairs))
    bounds = [pairs * n // threads for n in range(threads + 1)]
    others = []
    if threads > 1:
        pool = helper_threads(threads - 1)
        others = [pool.submit(kernel, *pointers, T, H, D, bounds[n], bounds[n + 1]) for n in range(threads - 1)]
    kernel(*pointers, T, H, D, bounds[-2], bounds[-1])
    for other in others:
        other.result()


# The ops are named after this module: a second copy of it (an export_hf.py folder loaded in the same process) then
# registers ops of its own, where one name registered twice would replace the op this module's code calls.
OP_NAMESPACE = __name__.replace(".", "_")


@torch.library.custom_op(f"{OP_NAMESPACE}::causal_attention_forward", mutates_args=())
def attention_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, lse): out (B, T, H, D), lse (B, H, T) the log-sum-exp of each query's scaled scores."""
    if not all(t.dtype == torch.float32 and t.device.type == "cpu" and t.shape == q.shape for t in (q, k, v)):
        raise ValueError("cpu_attention: q, k and v must be fp32 CPU tensors of one (B, T, H, D) shape")
    B, T, H, D = q.shape
    out = torch.empty_like(q)
    lse = torch.empty(B, H, T, dtype=torch.float32)
    over_pairs(load_library().attention_forward, [q, k, v, out, lse], B, T, H, D)
    return out, lse


@attention_forward.register_fake
def _(q, k, v):
    B, T, H, D = q.shape
    return torch.empty_like(q), q.new_empty(B, H, T)


@torch.library.custom_op(f"{OP_NAMESPACE}::causal_attention_backward", mutates_args=())
def attention_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, dout: torch.Tensor,
                       lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    B, T, H, D = q.shape
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    over_pairs(load_library().attention_backward, [q, k, v, out, dout, lse, dq, dk, dv], B, T, H, D)
    return dq, dk, dv


@attention_backward.register_fake
def _(q, k, v, out, dout, lse):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def setup_context(ctx, inputs, output):
    ctx.save_for_backward(*inputs, *output)
    ctx.mark_non_differentiable(output[1])  # lse is the backward's input, never a loss's


def backward(ctx, grad_out, grad_lse):
    q, k, v, out, lse = ctx.saved_tensors
    return attention_backward(q, k, v, out, grad_out.contiguous(), lse)


attention_forward.register_autograd(backward, setup_context=setup_context)


def causal_attention(q, k, v):
    """q, k, v: (B, T, H, D) fp32 CPU tensors; softmax(q k^T / sqrt(D), causal) v, (B, T, H, D)."""
    out, lse = attention_forward(q.contiguous(), k.contiguous(), v.contiguous())
    return out
