"""The CfC scan at small batch as hand-written CUDA C: one block per batch row, two barriers per step.

Why: at batch 1 a training step of the flagship waits on the scan's 64 dependent steps forward and 64 backward.
Triton's row kernels (cfc_triton.py) spend about 3.5 us a step, most of it moving each product's output
through shared memory into the layout of the next product, with a barrier each time. Here the layout is chosen
so that every step is two matrix-vector products with exactly one exchange after each:

- forward, product A (backbone, u = tanh(0.666 (x_t + W_h h))): lane group j owns backbone unit j; its SA lanes
  each hold H/SA weights of W_h's row j in registers, read h from shared memory four floats at a time and
  finish with a log2(SA)-level shuffle. Then z = 1.7159 u goes to shared memory. Barrier.
- forward, product B (the four heads): lane group i owns state unit i; its SB lanes each hold U/SB weights of
  all four heads' row i, read z, shuffle, and every lane of the group has ff1, ff2, t_a and t_b of unit i, so
  the gate and the new state need no further exchange. h goes to shared memory. Barrier.
- the backward is the mirror image (d_z over the four heads' columns, then dL/dh over W_h's columns).

The math, what the forward saves and what the backward writes are exactly the Triton row kernels' (and so
`CfCScan`'s), so the autograd formula and the weight-gradient GEMMs in cfc_triton.py serve both. Compiled with
NVRTC for the device at first use (nvrtc.py). fp32 inputs only: other dtypes, sizes whose lanes do not divide
evenly, or a machine without NVRTC take the Triton row kernel (`supported`, `RowScan`).
"""

from __future__ import annotations

import warnings

import torch

from alpha_core.models import nvrtc

SOURCE = r"""
#define LECUN_A 1.7159f
#define LECUN_B 0.666f

__device__ __forceinline__ float sigmoid_(float x) { return 1.0f / (1.0f + expf(-x)); }

template <int N>
__device__ __forceinline__ float group_sum(float v) {  // sum over N adjacent lanes, every lane gets it
#pragma unroll
  for (int o = N / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// H state units, U backbone units, NT threads; xproj [B, L, U], ts [B, L, H], w_h [U, H], w_heads [4H, U],
// b_heads [4H]; out [B, L, H]; saved for the backward: u [B, L, U], tanh ff1, tanh ff2, g, t_a [B, L, H].
template <int H, int U, int NT, bool SAVE>
__global__ void __launch_bounds__(NT, 1) cfc_fwd(
    const float* __restrict__ xproj, const float* __restrict__ ts, const float* __restrict__ w_h,
    const float* __restrict__ w_heads, const float* __restrict__ b_heads, float* __restrict__ out,
    float* __restrict__ u_s, float* __restrict__ f1_s, float* __restrict__ f2_s, float* __restrict__ g_s,
    float* __restrict__ ta_s, int L) {
  constexpr int SA = NT / U, KA = H / SA;  // product A: lanes per backbone unit, weights per lane
  constexpr int SB = NT / H, KB = U / SB;  // product B: lanes per state unit, weights per lane and head
  __shared__ __align__(16) float h_sh[H];
  __shared__ __align__(16) float z_sh[U];
  const int tid = threadIdx.x;
  const int j = tid / SA, sa = tid % SA;
  const int i = tid / SB, sb = tid % SB;
  const long long row = blockIdx.x;
  float wa[KA];  // W_h[j, k] for k = 4 (sa + SA m) + c: lanes of a group read adjacent float4s of h
#pragma unroll
  for (int m = 0; m < KA / 4; ++m)
#pragma unroll
    for (int c = 0; c < 4; ++c) wa[4 * m + c] = w_h[j * H + 4 * (sa + SA * m) + c];
  float wb[4][KB];  // head q's W[i, k] for k = 4 (sb + SB m) + c
#pragma unroll
  for (int q = 0; q < 4; ++q)
#pragma unroll
    for (int m = 0; m < KB / 4; ++m)
#pragma unroll
      for (int c = 0; c < 4; ++c) wb[q][4 * m + c] = w_heads[(q * H + i) * U + 4 * (sb + SB * m) + c];
  const float b1 = b_heads[i], b2 = b_heads[H + i], b3 = b_heads[2 * H + i], b4 = b_heads[3 * H + i];
  for (int k = tid; k < H; k += NT) h_sh[k] = 0.0f;
  __syncthreads();
  const float* x_row = xproj + row * L * U;
  const float* ts_row = ts + row * L * H;
  float x_next = x_row[j], ts_next = ts_row[i];
  for (int t = 0; t < L; ++t) {
    const float x_t = x_next, ts_t = ts_next;
    if (t + 1 < L) {  // the next step's inputs do not depend on this step: load them now
      x_next = x_row[(t + 1) * U + j];
      ts_next = ts_row[(t + 1) * H + i];
    }
    float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const float4* h4 = reinterpret_cast<const float4*>(h_sh);
#pragma unroll
    for (int m = 0; m < KA / 4; ++m) {
      const float4 v = h4[sa + SA * m];
      a[0] = fmaf(wa[4 * m], v.x, a[0]);
      a[1] = fmaf(wa[4 * m + 1], v.y, a[1]);
      a[2] = fmaf(wa[4 * m + 2], v.z, a[2]);
      a[3] = fmaf(wa[4 * m + 3], v.w, a[3]);
    }
    const float u = tanhf(LECUN_B * (x_t + group_sum<SA>((a[0] + a[1]) + (a[2] + a[3]))));
    if (sa == 0) {
      z_sh[j] = LECUN_A * u;
      if (SAVE) u_s[(row * L + t) * U + j] = u;
    }
    __syncthreads();
    float o[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const float4* z4 = reinterpret_cast<const float4*>(z_sh);
#pragma unroll
    for (int m = 0; m < KB / 4; ++m) {
      const float4 v = z4[sb + SB * m];
#pragma unroll
      for (int q = 0; q < 4; ++q) {
        o[q] = fmaf(wb[q][4 * m], v.x, o[q]);
        o[q] = fmaf(wb[q][4 * m + 1], v.y, o[q]);
        o[q] = fmaf(wb[q][4 * m + 2], v.z, o[q]);
        o[q] = fmaf(wb[q][4 * m + 3], v.w, o[q]);
      }
    }
    const float ta = group_sum<SB>(o[2]) + b3;
    const float g = sigmoid_(ta * ts_t + group_sum<SB>(o[3]) + b4);
    const float f1 = tanhf(group_sum<SB>(o[0]) + b1), f2 = tanhf(group_sum<SB>(o[1]) + b2);
    const float h = f1 * (1.0f - g) + g * f2;
    const long long at = (row * L + t) * H + i;
    if (sb == 0) {
      h_sh[i] = h;
      out[at] = h;
    }
    if (SAVE) {  // spread over the group's lanes
      if (sb == 1 % SB) f1_s[at] = f1;
      if (sb == 2 % SB) f2_s[at] = f2;
      if (sb == 3 % SB) {
        g_s[at] = g;
        ta_s[at] = ta;
      }
    }
    __syncthreads();
  }
}

// The backward, steps in reverse: dL/d(heads) [B, L, 4H] (ff1, ff2, time_a, time_b), dL/dxproj [B, L, U] (= into
// the backbone's pre-activation) and dL/dts [B, L, H]; the weight gradients are GEMMs over all steps afterwards.
template <int H, int U, int NT>
__global__ void __launch_bounds__(NT, 1) cfc_bwd(
    const float* __restrict__ grad_out, const float* __restrict__ ts, const float* __restrict__ w_h,
    const float* __restrict__ w_heads, const float* __restrict__ u_s, const float* __restrict__ f1_s,
    const float* __restrict__ f2_s, const float* __restrict__ g_s, const float* __restrict__ ta_s,
    float* __restrict__ d_xproj, float* __restrict__ d_heads, float* __restrict__ d_ts, int L) {
  constexpr int SC = NT / U, KC = H / SC;  // d_z: lanes per backbone unit, weights per lane and head
  constexpr int SD = NT / H, KD = U / SD;  // dL/dh: lanes per state unit, weights per lane
  __shared__ __align__(16) float dv_sh[4][H];  // d ff1, d ff2, d time_a, d time_b of this step
  __shared__ __align__(16) float da_sh[U];
  const int tid = threadIdx.x;
  const int j = tid / SC, sc = tid % SC;
  const int k = tid / SD, sd = tid % SD;
  const long long row = blockIdx.x;
  float wc[4][KC];  // head q's W[i, j] for i = 4 (sc + SC m) + c
#pragma unroll
  for (int q = 0; q < 4; ++q)
#pragma unroll
    for (int m = 0; m < KC / 4; ++m)
#pragma unroll
      for (int c = 0; c < 4; ++c) wc[q][4 * m + c] = w_heads[(q * H + 4 * (sc + SC * m) + c) * U + j];
  float wd[KD];  // W_h[jj, k] for jj = 4 (sd + SD m) + c
#pragma unroll
  for (int m = 0; m < KD / 4; ++m)
#pragma unroll
    for (int c = 0; c < 4; ++c) wd[4 * m + c] = w_h[(4 * (sd + SD * m) + c) * H + k];
  if (L == 0) return;
  const long long base_h = row * L * H, base_u = row * L * U;
  int t = L - 1;
  float go = grad_out[base_h + t * H + k], f1 = f1_s[base_h + t * H + k], f2 = f2_s[base_h + t * H + k];
  float g = g_s[base_h + t * H + k], ta = ta_s[base_h + t * H + k], ts_t = ts[base_h + t * H + k];
  float u = u_s[base_u + t * U + j];
  float carry = 0.0f;
  for (; t >= 0; --t) {
    const float gh = go + carry;
    const float d_pre = gh * (f2 - f1) * g * (1.0f - g);
    const float d1 = gh * (1.0f - g) * (1.0f - f1 * f1);
    const float d2 = gh * g * (1.0f - f2 * f2);
    const float d3 = d_pre * ts_t;
    const long long at = base_h + t * H + k, ao = (row * L + t) * 4 * H + k;
    if (sd == 0) {
      dv_sh[0][k] = d1;
      d_heads[ao] = d1;
    }
    if (sd == 1 % SD) {
      dv_sh[1][k] = d2;
      d_heads[ao + H] = d2;
    }
    if (sd == 2 % SD) {
      dv_sh[2][k] = d3;
      d_heads[ao + 2 * H] = d3;
    }
    if (sd == 3 % SD) {
      dv_sh[3][k] = d_pre;
      d_heads[ao + 3 * H] = d_pre;
      d_ts[at] = d_pre * ta;
    }
    const float u_t = u;
    if (t > 0) {  // the previous step's inputs do not depend on this step: load them now
      const long long p = at - H;
      go = grad_out[p];
      f1 = f1_s[p];
      f2 = f2_s[p];
      g = g_s[p];
      ta = ta_s[p];
      ts_t = ts[p];
      u = u_s[base_u + (t - 1) * U + j];
    }
    __syncthreads();
    float a[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const float4* d4 = reinterpret_cast<const float4*>(dv_sh[q]);
#pragma unroll
      for (int m = 0; m < KC / 4; ++m) {
        const float4 v = d4[sc + SC * m];
        a[q] = fmaf(wc[q][4 * m], v.x, a[q]);
        a[q] = fmaf(wc[q][4 * m + 1], v.y, a[q]);
        a[q] = fmaf(wc[q][4 * m + 2], v.z, a[q]);
        a[q] = fmaf(wc[q][4 * m + 3], v.w, a[q]);
      }
    }
    const float d_z = group_sum<SC>((a[0] + a[1]) + (a[2] + a[3]));
    const float d_a = d_z * (LECUN_A * LECUN_B) * (1.0f - u_t * u_t);
    if (sc == 0) {
      da_sh[j] = d_a;
      d_xproj[base_u + t * U + j] = d_a;
    }
    __syncthreads();
    float c4[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    const float4* a4 = reinterpret_cast<const float4*>(da_sh);
#pragma unroll
    for (int m = 0; m < KD / 4; ++m) {
      const float4 v = a4[sd + SD * m];
      c4[0] = fmaf(wd[4 * m], v.x, c4[0]);
      c4[1] = fmaf(wd[4 * m + 1], v.y, c4[1]);
      c4[2] = fmaf(wd[4 * m + 2], v.z, c4[2]);
      c4[3] = fmaf(wd[4 * m + 3], v.w, c4[3]);
    }
    carry = group_sum<SD>((c4[0] + c4[1]) + (c4[2] + c4[3]));
  }
}
"""


def supported(hidden: int, units: int, threads: int) -> bool:
    """Whether the lanes divide evenly: every unit's lane group within one warp, four weights per float4."""
    if threads % 32 or threads > 1024:
        return False
    for rows, cols in ((units, hidden), (hidden, units)):  # (units a product owns, length it sums over)
        if threads % rows:
            return False
        lanes = threads // rows
        if lanes > 32 or lanes & (lanes - 1) or cols % (4 * lanes):
            return False
    return True


def forward_name(hidden: int, units: int, threads: int, save: bool) -> str:
    return f"cfc_fwd<{hidden}, {units}, {threads}, {'true' if save else 'false'}>"


def backward_name(hidden: int, units: int, threads: int) -> str:
    return f"cfc_bwd<{hidden}, {units}, {threads}>"


def kernel_names(hidden: int, units: int, threads: int) -> tuple[str, str, str]:
    """Every kernel a layer of this size may launch, compiled together."""
    return (
        forward_name(hidden, units, threads, True),
        forward_name(hidden, units, threads, False),
        backward_name(hidden, units, threads),
    )


class RowScan:
    """A scan direction with the launch interface of a Triton kernel (`kernel[grid](*args, **meta)`), as
    cfc_triton's launch plan calls it: the CUDA kernel where it applies, else the Triton row kernel `fallback`."""

    nvrtc_missing = False  # set at the first failed load, so later launches go straight to Triton

    def __init__(self, backward: bool, fallback) -> None:
        self.backward = backward
        self.fallback = fallback

    def __getitem__(self, grid: tuple[int]):
        return lambda *args, **meta: self._launch(grid, args, meta)

    @staticmethod
    def prefetch(hidden: int, units: int, threads: int, device: torch.device) -> None:
        """Start compiling the kernels `_launch` will load for a layer of this size (nvrtc.prefetch)."""
        if not RowScan.nvrtc_missing and supported(hidden, units, threads):
            nvrtc.prefetch(SOURCE, kernel_names(hidden, units, threads), device)

    def _launch(self, grid: tuple[int], args: tuple, meta: dict) -> None:
        hidden, units, threads = meta["H"], meta["U"], 32 * meta["num_warps"]
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if (
            not RowScan.nvrtc_missing
            and tensors[0].is_cuda
            and supported(hidden, units, threads)
            and all(t.dtype == torch.float32 for t in tensors)
        ):
            name = (
                backward_name(hidden, units, threads) if self.backward else forward_name(hidden, units, threads, meta["SAVE"])
            )
            try:
                kernel = nvrtc.load(SOURCE, kernel_names(hidden, units, threads), tensors[0].device)[name]
            except nvrtc.NvrtcUnavailable as exc:
                warnings.warn(f"CfC scan: {exc}; using the Triton row kernel", stacklevel=2)
                RowScan.nvrtc_missing = True
            else:
                *pointers, _batch, length = args
                kernel(grid[0], threads, *pointers, length)
                return
        self.fallback[grid](*args, **meta)
