// The int4 runtime's other row-wise operations: RMS norm, SiLU-gated product, rotary
// embedding and causal attention, each over all rows of a pass in ONE call.
//
// Why (measured on the 1.5B, AMD EPYC, 2 cores; docs/notes/runtime-search.md section 6): with the
// int4 kernel a one-token step spent 24.6 ms in the linear layers and 5.5 ms in some 1,000
// small torch calls around them (a norm alone is six; a 5-token pass ran attention as five
// calls a layer), and a 5-token pass 9.8 ms. The int8 runtime keeps those torch calls.
//
// Exactness (block == steps, bit for bit, at any thread count): every output row depends on
// its own input row alone (attention: on its own query row and the cached keys and values of
// its causal prefix), and each row is computed by one thread in a fixed order of roundings:
// reductions keep 8 partial sums (lane l takes elements l, l + 8, ...) combined in a fixed
// tree, exp is a fixed polynomial of IEEE additions and products. The file is compiled with
// -ffp-contract=off and without -ffast-math, so the compiler may vectorize these loops (the
// function clones below, for AVX-512, AVX2 and plain x86-64) but never reorders or fuses an
// operation: the clones give the same bits, and so does a row in a block or alone.

// ATen's tensor and the two factories only: torch/extension.h (pybind, the whole C++ API)
// took 31 s to parse per file on a 2-core EPYC, and only layer_stack.cpp, which binds the
// module, needs it (the kernel builds on a user's first run).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <algorithm>
#include <type_traits>
#include <vector>

#include "lanes.h"

namespace {

constexpr int kLanes = 8;
constexpr int kMaxGroup = 16;  // query heads a kv head's group takes at a time in attend
// Query heads whose values add in one sweep (add_values_group): six 16-lane sums and the
// value's block are 7 AVX-512 registers, or 14 of AVX2's 16 (two halves each): no spills.
constexpr int kValueHeads = 6;
// Causal query rows of a pass that read a kv head's cache together (attention_into): at
// most 16, so that a block's scores stay a few megabytes at long contexts.
constexpr int64_t kRowBlock = 16;

// 8 partial sums combined as ((0+4)+(1+5))+((2+6)+(3+7)).
inline float lane_sum(const float* acc) {
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// A float (or int) as the other type, lane by lane for vectors; floats are truncated.
template <typename To, typename From>
inline To convert(From x) {
  if constexpr (std::is_arithmetic_v<From>) {
    return static_cast<To>(x);
  } else {
    return __builtin_convertvector(x, To);
  }
}

template <typename F, typename I>
inline F from_bits(I bits) {
  F out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

// exp(x) by Cephes' expf polynomial (about 1 ulp) for 8 lanes, in GCC's vector extensions:
// IEEE operations only, lane by lane, so the same bits whatever instructions a clone compiles
// them to, and the same as `exp_one` (the same steps on one float, for the tails). NaN stays
// NaN; below -87.3 the result flushes towards 0.
template <typename F, typename I>
inline F exp_steps(F x) {
  const F input = x;
  x = x > 88.3762626647949f ? F{} + 88.3762626647949f : x;
  x = x < -87.3365478515625f ? F{} - 87.3365478515625f : x;
  const F fx = x * 1.44269504088896341f + 0.5f;
  F floor_fx = convert<F>(convert<I>(fx));
  floor_fx = floor_fx > fx ? floor_fx - 1.0f : floor_fx;
  x = x - floor_fx * 0.693359375f;
  x = x - floor_fx * -2.12194440e-4f;
  const F z = x * x;
  F y = F{} + 1.9875691500e-4f;
  y = y * x + 1.3981999507e-3f;
  y = y * x + 8.3334519073e-3f;
  y = y * x + 4.1665795894e-2f;
  y = y * x + 1.6666665459e-1f;
  y = y * x + 5.0000001201e-1f;
  y = y * z + x + 1.0f;
  const F scale = from_bits<F, I>((convert<I>(floor_fx) + 127) << 23);
  return input != input ? input : y * scale;
}

// 16 lanes, where lanes need not add up among themselves (one AVX-512 register; two of AVX2).
typedef float F16 __attribute__((vector_size(64)));
typedef int32_t I16 __attribute__((vector_size(64)));
typedef float F4 __attribute__((vector_size(16)));

// A vector of floats from memory (any alignment), and back.
template <typename V>
inline V load(const float* p) {
  V out;
  std::memcpy(&out, p, sizeof(out));
  return out;
}

template <typename V>
inline void store(float* p, V x) {
  std::memcpy(p, &x, sizeof(x));
}

inline F16 exp16(F16 x) { return exp_steps<F16, I16>(x); }

inline float exp_one(float x) { return exp_steps<float, int32_t>(x); }
inline F8 exp8(F8 x) { return exp_steps<F8, I8>(x); }

SPECDEC_CLONES void rms_norm_row(const float* x, const float* weight, float eps, int64_t n,
                                 float* out) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) acc[l] += x[i + l] * x[i + l];
  }
  for (; i < n; ++i) acc[i % kLanes] += x[i] * x[i];
  const float inverse = 1.0f / std::sqrt(lane_sum(acc) / static_cast<float>(n) + eps);
  for (int64_t j = 0; j < n; ++j) out[j] = weight[j] * (x[j] * inverse);
}

SPECDEC_CLONES void silu_mul_row(const float* gate, const float* up, int64_t n, float* out) {
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const F8 g = load<F8>(gate + j);
    store(out + j, (g / (1.0f + exp8(-g))) * load<F8>(up + j));
  }
  for (; j < n; ++j) out[j] = (gate[j] / (1.0f + exp_one(-gate[j]))) * up[j];
}

// x * cos + rotate_half(x) * sin for one head of one row (rotate_half(x) = [-x2, x1]):
// the products and the sum rounded as torch rounds them.
SPECDEC_CLONES void rope_head(float* x, const float* cos, const float* sin, int64_t d) {
  const int64_t half = d / 2;
  float rotated[512];
  for (int64_t j = 0; j < half; ++j) rotated[j] = -x[j + half];
  for (int64_t j = half; j < d; ++j) rotated[j] = x[j - half];
  for (int64_t j = 0; j < d; ++j) x[j] = x[j] * cos[j] + rotated[j] * sin[j];
}

inline F4 halves_added(F8 a) {  // lanes 0-3 plus lanes 4-7
  return __builtin_shufflevector(a, a, 0, 1, 2, 3) + __builtin_shufflevector(a, a, 4, 5, 6, 7);
}

// lane_sum of four 8-lane vectors at once, in the registers: lane k is lane_sum(a_k), the
// same additions in the same order ((0+4)+(1+5))+((2+6)+(3+7)).
inline F4 lane_sums(F8 a0, F8 a1, F8 a2, F8 a3) {
  const F4 t0 = halves_added(a0), t1 = halves_added(a1);
  const F4 t2 = halves_added(a2), t3 = halves_added(a3);
  // column i of the 4 x 4 matrix whose row k is t_k: c_i[k] = t_k[i]
  const F4 lo01 = __builtin_shufflevector(t0, t1, 0, 4, 1, 5);
  const F4 lo23 = __builtin_shufflevector(t2, t3, 0, 4, 1, 5);
  const F4 hi01 = __builtin_shufflevector(t0, t1, 2, 6, 3, 7);
  const F4 hi23 = __builtin_shufflevector(t2, t3, 2, 6, 3, 7);
  const F4 c0 = __builtin_shufflevector(lo01, lo23, 0, 1, 4, 5);
  const F4 c1 = __builtin_shufflevector(lo01, lo23, 2, 3, 6, 7);
  const F4 c2 = __builtin_shufflevector(hi01, hi23, 0, 1, 4, 5);
  const F4 c3 = __builtin_shufflevector(hi01, hi23, 2, 3, 6, 7);
  return (c0 + c1) + (c2 + c3);
}

// The largest of n scores (at least one); a NaN never wins. Lane by lane, then across the
// lanes: the same maximum as a scan in order (the order can only change the sign of a zero
// maximum, and the scores minus either zero are the same numbers).
inline float largest(const float* s, int64_t n) {
  float top = -INFINITY;
  int64_t j = 0;
  if (n >= 16) {
    F16 lanes = F16{} - INFINITY;
    for (; j + 16 <= n; j += 16) {
      const F16 x = load<F16>(s + j);
      lanes = x > lanes ? x : lanes;
    }
    for (int l = 0; l < 16; ++l) top = lanes[l] > top ? lanes[l] : top;
  }
  for (; j < n; ++j) top = s[j] > top ? s[j] : top;
  return top;
}

// q.k * scaling of the `group` query heads for `n` keys in a row (key j at keys + j * d),
// into scores[g * stride + j]: four keys at a time, four independent chains of sums, each
// key's number the same as alone. The partial sums are 8-lane vectors held in registers
// (lane l takes elements l, l + 8, ...); written as arrays of 8 floats, GCC kept them on the
// stack and merged two keys into one 16-lane register, and attention ran at about 4 products
// a cycle (measured, bench/attention_rows.py). The same operations either way: the same bits.
__attribute__((always_inline)) inline void key_scores(const float* q, int64_t group,
                                                      const float* keys, int64_t n, int64_t d,
                                                      float scaling, float* scores,
                                                      int64_t stride) {
  const int64_t body = d - d % kLanes;  // elements the vectors take; the rest lane by lane
  int64_t j = 0;
  if (body == d) {  // eight keys at a time: eight chains of sums in flight
    for (; j + 8 <= n; j += 8) {
      const float* key = keys + j * d;
      for (int64_t g = 0; g < group; ++g) {
        const float* qg = q + g * d;
        F8 a[8] = {};
        for (int64_t i = 0; i < d; i += kLanes) {
          const F8 x = load<F8>(qg + i);
          for (int k = 0; k < 8; ++k) a[k] = a[k] + x * load<F8>(key + k * d + i);
        }
        store(scores + g * stride + j, lane_sums(a[0], a[1], a[2], a[3]) * scaling);
        store(scores + g * stride + j + 4, lane_sums(a[4], a[5], a[6], a[7]) * scaling);
      }
    }
  }
  for (; j + 4 <= n; j += 4) {
    const float* key = keys + j * d;
    for (int64_t g = 0; g < group; ++g) {
      const float* qg = q + g * d;
      F8 a0 = {}, a1 = {}, a2 = {}, a3 = {};
      for (int64_t i = 0; i < body; i += kLanes) {
        const F8 x = load<F8>(qg + i);
        a0 = a0 + x * load<F8>(key + i);
        a1 = a1 + x * load<F8>(key + d + i);
        a2 = a2 + x * load<F8>(key + 2 * d + i);
        a3 = a3 + x * load<F8>(key + 3 * d + i);
      }
      if (body == d) {
        store(scores + g * stride + j, lane_sums(a0, a1, a2, a3) * scaling);
        continue;
      }
      float acc[4][kLanes];
      store(acc[0], a0);
      store(acc[1], a1);
      store(acc[2], a2);
      store(acc[3], a3);
      for (int64_t i = body; i < d; ++i) {
        for (int k = 0; k < 4; ++k) acc[k][i % kLanes] += qg[i] * key[k * d + i];
      }
      for (int k = 0; k < 4; ++k) scores[g * stride + j + k] = lane_sum(acc[k]) * scaling;
    }
  }
  for (; j < n; ++j) {
    const float* key = keys + j * d;
    for (int64_t g = 0; g < group; ++g) {
      const float* qg = q + g * d;
      F8 a = {};
      for (int64_t i = 0; i < body; i += kLanes) a = a + load<F8>(qg + i) * load<F8>(key + i);
      float acc[kLanes];
      store(acc, a);
      for (int64_t i = body; i < d; ++i) acc[i % kLanes] += qg[i] * key[i];
      scores[g * stride + j] = lane_sum(acc) * scaling;
    }
  }
}

// o_h += p_h[j] * values[j] for `heads` query heads over the same values, on 16 elements
// [i, i + 16) of each (head h's weights at p + h * p_stride, its output at o + h * d), the
// sums held in registers for all n values. Each element takes its n sums one by one in
// order of j, whatever the heads beside it: the same operations, the same bits, as a head
// alone or a block of another width.
template <int heads>
__attribute__((always_inline)) inline void add_values_heads(const float* p, int64_t p_stride,
                                                            const float* values, int64_t n,
                                                            int64_t d, int64_t i, float* o) {
  F16 acc[heads];
  for (int h = 0; h < heads; ++h) acc[h] = load<F16>(o + h * d + i);
  for (int64_t j = 0; j < n; ++j) {
    const F16 v = load<F16>(values + j * d + i);
    for (int h = 0; h < heads; ++h) acc[h] = acc[h] + p[h * p_stride + j] * v;
  }
  for (int h = 0; h < heads; ++h) store(o + h * d + i, acc[h]);
}

// add_values_heads for the `group` heads of a kv head (head g: weights p + g * p_stride,
// output o + g * d), kValueHeads at a time in blocks of 16 elements, the rest of a row's
// elements one by one: each value is read once for six heads, where a head at a time read
// it anew from the caches (a megabyte a kv head at 2,048 positions for the 1.5B).
__attribute__((always_inline)) inline void add_values_group(const float* p, int64_t p_stride,
                                                            int64_t group, const float* values,
                                                            int64_t n, int64_t d, float* o) {
  const int64_t body = d - d % 16;
  for (int64_t g = 0; g < group; g += kValueHeads) {
    const float* pg = p + g * p_stride;
    float* og = o + g * d;
    const int64_t heads = std::min<int64_t>(kValueHeads, group - g);
    for (int64_t i = 0; i < body; i += 16) {
      switch (heads) {
        case 6: add_values_heads<6>(pg, p_stride, values, n, d, i, og); break;
        case 5: add_values_heads<5>(pg, p_stride, values, n, d, i, og); break;
        case 4: add_values_heads<4>(pg, p_stride, values, n, d, i, og); break;
        case 3: add_values_heads<3>(pg, p_stride, values, n, d, i, og); break;
        case 2: add_values_heads<2>(pg, p_stride, values, n, d, i, og); break;
        default: add_values_heads<1>(pg, p_stride, values, n, d, i, og); break;
      }
    }
    for (int64_t h = 0; h < heads; ++h) {  // a head size not a multiple of 16: the rest
      for (int64_t i = body; i < d; ++i) {
        float acc = og[h * d + i];
        for (int64_t j = 0; j < n; ++j) acc = acc + pg[h * p_stride + j] * values[j * d + i];
        og[h * d + i] = acc;
      }
    }
  }
}

// A head's scores s[0 .. end) in place as exp(s - max s): 16 lanes, then 8, then one at a
// time from the start, so a head's numbers are the same in attend and attend_rows.
__attribute__((always_inline)) inline void exp_from_top(float* s, int64_t end) {
  const float top = largest(s, end);
  int64_t e = 0;
  for (; e + 16 <= end; e += 16) store(s + e, exp16(load<F16>(s + e) - top));
  for (; e + 8 <= end; e += 8) store(s + e, exp8(load<F8>(s + e) - top));
  for (; e < end; ++e) s[e] = exp_one(s[e] - top);
}

// The query rows of the `group` heads that share one kv head, at one position:
// softmax(q.k * scaling) v for each, over the `held` keys and values of the buffer and then
// `n_path` more in a row (a draft tree's row: its path's own, gathered; none for a causal
// row, whose keys are all in the buffer). Each key and value row is read once for the group
// (values: once for kValueHeads heads); each head's numbers are computed in the same order whatever
// the group, and a tree row's are those of its path's row computed as a chain, bit for bit
// (the same keys in the same order: a key's score does not depend on its neighbours, and the
// values add in order).
SPECDEC_CLONES void attend(const float* q, int64_t group, const float* keys,
                           const float* values, int64_t held, const float* path_keys,
                           const float* path_values, int64_t n_path, int64_t d, float scaling,
                           float* scores, float* out) {
  const int64_t end = held + n_path;
  key_scores(q, group, keys, held, d, scaling, scores, end);
  key_scores(q, group, path_keys, n_path, d, scaling, scores + held, end);
  for (int64_t g = 0; g < group; ++g) exp_from_top(scores + g * end, end);
  // Each head's total summed in order of j; the heads' sums side by side (one chain each).
  for (int64_t g0 = 0; g0 < group; g0 += kMaxGroup) {
    const int64_t heads = std::min<int64_t>(kMaxGroup, group - g0);
    float totals[kMaxGroup] = {};
    for (int64_t j = 0; j < end; ++j) {
      for (int64_t g = 0; g < heads; ++g) totals[g] += scores[(g0 + g) * end + j];
    }
    for (int64_t g = 0; g < heads; ++g) {
      float* o = out + (g0 + g) * d;
      for (int64_t i = 0; i < d; ++i) o[i] = 0.0f;
    }
    add_values_group(scores + g0 * end, end, heads, values, held, d, out + g0 * d);
    add_values_group(scores + g0 * end + held, end, heads, path_values, n_path, d, out + g0 * d);
    for (int64_t g = 0; g < heads; ++g) {
      float* o = out + (g0 + g) * d;
      const float inverse = 1.0f / totals[g];
      for (int64_t i = 0; i < d; ++i) o[i] *= inverse;
    }
  }
}

// add_values_group over the values in tiles of kValueTile positions: each tile's values are
// read from memory once for all `group` heads (kValueHeads at a time from L2), where one sweep
// of all of them per six heads read a long context's values again from memory for each six.
// Every element still takes its sums one by one in order of j: the same bits.
constexpr int64_t kValueTile = 256;  // 128 KB of a kv head's values at d = 128
__attribute__((always_inline)) inline void add_values_tiled(const float* p, int64_t p_stride,
                                                            int64_t group, const float* values,
                                                            int64_t n, int64_t d, float* o) {
  for (int64_t j = 0; j < n; j += kValueTile) {
    add_values_group(p + j, p_stride, group, values + j * d, std::min(kValueTile, n - j), d, o);
  }
}

// The causal query rows r0 .. r1 - 1 of the `group` heads that share one kv head: row r
// attends to the first held + r + 1 positions. The keys and values all of them attend to (the
// first held + r0 + 1) are read once for the block, for all its rows' heads at a time, then
// each row's own few after them: each row-head's scores, softmax and sums are the numbers
// attend computes for that row alone, in the same order (a key's score does not depend on
// the heads beside it, the values add in order of j), so the same bits. Where each row read
// the whole cache anew, a pass of 8 rows over 4,096 positions read the 1.5B's caches 8 times
// (57 KB a position; bench/results/2026-12-07-attention-rows-zen4-epyc-avx512).
// q: the rows' query heads gathered, [rows][group][d]; scores: room for rows * group *
// (held + r1) floats; out: [rows][group][d], written.
SPECDEC_CLONES void attend_rows(const float* q, int64_t rows, int64_t group, const float* keys,
                                const float* values, int64_t shared, int64_t d, float scaling,
                                float* scores, float* out) {
  const int64_t heads = rows * group, stride = shared + rows - 1;
  key_scores(q, heads, keys, shared, d, scaling, scores, stride);
  for (int64_t i = 1; i < rows; ++i) {  // row i's own i positions after the shared ones
    key_scores(q + i * group * d, group, keys + shared * d, i, d, scaling,
               scores + i * group * stride + shared, stride);
  }
  std::vector<float> totals(heads);
  for (int64_t h = 0; h < heads; ++h) {
    float* s = scores + h * stride;
    const int64_t end = shared + h / group;
    exp_from_top(s, end);
    float total = 0.0f;  // summed in order of j, as attend sums each head's
    for (int64_t j = 0; j < end; ++j) total += s[j];
    totals[h] = total;
  }
  std::fill_n(out, heads * d, 0.0f);
  add_values_tiled(scores, stride, heads, values, shared, d, out);
  for (int64_t i = 1; i < rows; ++i) {
    add_values_group(scores + i * group * stride + shared, stride, group, values + shared * d, i,
                     d, out + i * group * d);
  }
  for (int64_t h = 0; h < heads; ++h) {
    const float inverse = 1.0f / totals[h];
    for (int64_t i = 0; i < d; ++i) out[h * d + i] *= inverse;
  }
}

void check_rows(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.is_contiguous(), name,
              ": [rows, n] float32, contiguous");
}

}  // namespace

// x  # [rows, n]; weight  # [n]  ->  weight * (x / sqrt(mean(x^2) + eps)), row by row
at::Tensor rms_norm(at::Tensor x, at::Tensor weight, double eps) {
  check_rows(x, "x");
  const int64_t rows = x.size(0), n = x.size(1);
  const at::Tensor w = weight.contiguous();
  TORCH_CHECK(w.scalar_type() == at::kFloat && w.numel() == n, "weight: [n] float32");
  at::Tensor out = at::empty_like(x);
  const float *in = x.data_ptr<float>(), *wd = w.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, rows, 16, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      rms_norm_row(in + r * n, wd, static_cast<float>(eps), n, o + r * n);
    }
  });
  return out;
}

// gate_up  # [rows, 2n] (gate, then up)  ->  silu(gate) * up  # [rows, n]
at::Tensor silu_mul(at::Tensor gate_up) {
  check_rows(gate_up, "gate_up");
  const int64_t rows = gate_up.size(0), n = gate_up.size(1) / 2;
  TORCH_CHECK(gate_up.size(1) == 2 * n, "gate_up: an even width");
  at::Tensor out = at::empty({rows, n}, gate_up.options());
  const float* in = gate_up.data_ptr<float>();
  float* o = out.data_ptr<float>();
  at::parallel_for(0, rows, 4, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) silu_mul_row(in + r * 2 * n, in + r * 2 * n + n, n, o + r * n);
  });
  return out;
}

// x  # [rows, heads, d] rotated in place by cos, sin  # [rows, d]
void rope_(at::Tensor x, at::Tensor cos, at::Tensor sin) {
  TORCH_CHECK(x.dim() == 3 && x.scalar_type() == at::kFloat && x.is_contiguous(),
              "x: [rows, heads, d] float32, contiguous");
  const int64_t rows = x.size(0), heads = x.size(1), d = x.size(2);
  TORCH_CHECK(d % 2 == 0 && d <= 512, "head size: even, at most 512");
  check_rows(cos, "cos");
  check_rows(sin, "sin");
  TORCH_CHECK(cos.size(0) == rows && cos.size(1) == d && sin.sizes() == cos.sizes(),
              "cos, sin: [rows, d]");
  float* data = x.data_ptr<float>();
  const float *c = cos.data_ptr<float>(), *s = sin.data_ptr<float>();
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t h = 0; h < heads; ++h) rope_head(data + (r * heads + h) * d, c + r * d, s + r * d, d);
  }
}

// A fused q/k/v product's rows of one sequence (qkv: [rows, (heads + 2 kv_heads) d]) split
// by head: its queries rotated into query  # [rows, heads, d]; its keys rotated and, with
// its values, written at positions first .. first + rows - 1 of the sequence's buffers
// (kv head h, position p at keys + h * k_stride + p * d). cos, sin: [rows, d]. The same
// rope_head on the same numbers as rope_ of the heads split apart.
void split_heads_into(const float* qkv, int64_t rows, int64_t heads, int64_t kv_heads,
                      int64_t d, const float* cos, const float* sin, float* query, float* keys,
                      int64_t k_stride, float* values, int64_t v_stride, int64_t first) {
  const int64_t width = (heads + 2 * kv_heads) * d;
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = qkv + r * width;
    const float *c = cos + r * d, *s = sin + r * d;
    for (int64_t h = 0; h < heads; ++h) {
      float* q = query + (r * heads + h) * d;
      std::copy_n(row + h * d, d, q);
      rope_head(q, c, s, d);
    }
    for (int64_t h = 0; h < kv_heads; ++h) {
      float* k = keys + h * k_stride + (first + r) * d;
      std::copy_n(row + (heads + h) * d, d, k);
      rope_head(k, c, s, d);
      std::copy_n(row + (heads + kv_heads + h) * d, d, values + h * v_stride + (first + r) * d);
    }
  }
}

// The attention of `rows` query rows (q: [rows, heads, d], contiguous) over a kv head's
// keys and values at k + h * k_stride (positions of d contiguous floats; the last `rows`
// are the rows' own), into out  # [rows, heads, d]. Row i attends to positions
// 0 .. positions - rows + i; or, given `parents`, to the prefix and its own path of rows: a
// draft tree's rows, each as its path would be computed as a chain. `parents` holds one
// entry per tree row (the tree row it hangs under, -1 for the prefix's last position; a
// parent comes before its children): the tree's rows already held (the positions just
// before the query rows' own, parents.size() - rows of them: a draft tree grown over
// several passes) and then the query rows. The prefix is what comes before the tree.
void attention_into(const float* qd, int64_t rows, int64_t heads, int64_t d, const float* kd,
                    int64_t k_stride, const float* vd, int64_t v_stride, int64_t kv_heads,
                    int64_t positions, double scaling, const std::vector<int64_t>& parents,
                    float* o) {
  TORCH_CHECK(heads % kv_heads == 0, "head sizes do not match");
  TORCH_CHECK(positions >= rows, "the cache must hold the rows' own positions");
  const int64_t tree = parents.empty() ? rows : static_cast<int64_t>(parents.size());
  const int64_t tree_held = tree - rows;  // a tree's rows held from earlier passes
  TORCH_CHECK(tree_held >= 0 && tree_held <= positions - rows,
              "parents: one per held tree row and per row");
  const int64_t held = positions - rows - tree_held;  // the prefix before the tree
  // A tree's paths: tree row t's rows, root first, at paths[t * tree ...], lengths[t] of them.
  std::vector<int64_t> paths, lengths;
  if (!parents.empty()) {
    paths.assign(tree * tree, 0);
    lengths.assign(tree, 0);
    for (int64_t t = 0; t < tree; ++t) {
      const int64_t parent = parents[t];
      TORCH_CHECK(parent >= -1 && parent < t, "parents: -1 or an earlier row");
      if (parent >= 0) {
        std::copy_n(paths.begin() + parent * tree, lengths[parent], paths.begin() + t * tree);
        lengths[t] = lengths[parent];
      }
      paths[t * tree + lengths[t]++] = t;
    }
  }
  const int64_t group = heads / kv_heads;
  if (parents.empty()) {  // causal rows: blocks of rows, each over a kv head read once
    const int64_t threads = at::get_num_threads();
    const int64_t blocks = std::min(
        rows, std::max<int64_t>((rows + kRowBlock - 1) / kRowBlock,
                                (threads + kv_heads - 1) / kv_heads));
    const int64_t size = (rows + blocks - 1) / blocks;
    at::parallel_for(0, blocks * kv_heads, 1, [&](int64_t begin, int64_t end) {
      std::vector<float> q, scores, out;
      for (int64_t item = begin; item < end; ++item) {
        const int64_t r0 = item / kv_heads * size, kv = item % kv_heads;
        const int64_t n = std::min(size, rows - r0);
        if (n <= 0) continue;
        q.resize(n * group * d);
        out.resize(n * group * d);
        scores.resize(n * group * (held + r0 + n));
        const int64_t width = group * d;  // a row's heads of this kv head
        for (int64_t i = 0; i < n; ++i) {
          std::copy_n(qd + ((r0 + i) * heads + kv * group) * d, width, q.data() + i * width);
        }
        attend_rows(q.data(), n, group, kd + kv * k_stride, vd + kv * v_stride, held + r0 + 1, d,
                    static_cast<float>(scaling), scores.data(), out.data());
        for (int64_t i = 0; i < n; ++i) {
          std::copy_n(out.data() + i * width, width, o + ((r0 + i) * heads + kv * group) * d);
        }
      }
    });
    return;
  }
  // A tree's rows, one at a time: the path's keys and values gathered after the prefix's.
  at::parallel_for(0, rows * kv_heads, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> scores(group * positions), path_keys(tree * d), path_values(tree * d);
    for (int64_t item = begin; item < end; ++item) {
      const int64_t r = item / kv_heads, kv = item % kv_heads;
      const int64_t first = (r * heads + kv * group) * d;  // the group's first query head
      const float *k_head = kd + kv * k_stride, *v_head = vd + kv * v_stride;
      const int64_t t = tree_held + r, n = lengths[t];
      for (int64_t p = 0; p < n; ++p) {
        const int64_t at = held + paths[t * tree + p];
        std::copy_n(k_head + at * d, d, path_keys.data() + p * d);
        std::copy_n(v_head + at * d, d, path_values.data() + p * d);
      }
      attend(qd + first, group, k_head, v_head, held, path_keys.data(), path_values.data(), n, d,
             static_cast<float>(scaling), scores.data(), o + first);
    }
  });
}

// query  # [rows, heads, d]; keys, values  # [kv_heads, positions, d], the last `rows`
// positions being the rows' own: attention_into. ->  [rows, heads, d]
at::Tensor causal_attention(at::Tensor query, at::Tensor keys, at::Tensor values,
                            double scaling, std::vector<int64_t> parents) {
  TORCH_CHECK(query.dim() == 3 && query.scalar_type() == at::kFloat, "query: [rows, heads, d]");
  TORCH_CHECK(keys.dim() == 3 && keys.scalar_type() == at::kFloat &&
                  values.sizes() == keys.sizes() && values.scalar_type() == at::kFloat,
              "keys, values: [kv_heads, positions, d] float32");
  // Keys and values may be views of a larger buffer (backends/kv_buffer.py): any stride
  // between heads, rows of d contiguous floats.
  const auto rows_contiguous = [](const at::Tensor& t) {
    return t.stride(2) == 1 && t.stride(1) == t.size(2) ? t : t.contiguous();
  };
  const at::Tensor q = query.contiguous(), k = rows_contiguous(keys),
                      v = rows_contiguous(values);
  const int64_t rows = q.size(0), heads = q.size(1), d = q.size(2);
  TORCH_CHECK(k.size(2) == d, "head sizes do not match");
  at::Tensor out = at::empty({rows, heads, d}, q.options());
  attention_into(q.data_ptr<float>(), rows, heads, d, k.data_ptr<float>(), k.stride(0),
                 v.data_ptr<float>(), v.stride(0), k.size(0), k.size(1), scaling, parents,
                 out.data_ptr<float>());
  return out;
}
