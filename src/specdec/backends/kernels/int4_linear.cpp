// specdec's int4 linear layer: 4-bit weights in groups of 32 (a scale and a minimum per
// group, float16), int8 activations in groups of 32 (a scale per group), for the CPU.
//
// Why a kernel of our own (measured in docs/notes/runtime-search.md): PyTorch's int4 kernel
// unpacks at about half the memory speed and takes rows in groups of 4, so a 5-token verify
// pass costs 2.4-2.8 one-token steps; llama.cpp's multi-token passes cost 2.4-3.8 steps here.
// This kernel unpacks each block of weights once and applies it to up to 8 rows of the pass
// (4 on AVX2) while it sits in registers (more rows: again from cache), so a verify pass
// reads the weights from memory once.
//
// Exactness (block == steps, bit for bit, at any thread count): output (row r, column n) is
//   acc = 0
//   for each group g in order: isum = sum over the group of code[n,k] * a[r,k]  (int32, exact)
//                              t    = float(isum) * d[n,g]
//                              acc  = fma(t, da[r,g], acc)
//                              acc  = fma(m[n,g], das[r,g], acc)
//   out  = acc + bias[n]
// where a row's int8 codes a, its scales da and das = da * sum(a over the group) depend on
// that row alone. Each (r, n) is computed by one thread with this sequence of roundings
// whatever the number of rows, the thread count or the code path (AVX-512 VNNI, AVX2,
// scalar): the integer sums are exact and every float operation is the same in the same
// order. The file is compiled with -ffp-contract=off so that the compiler adds no fusion.
//
// Layout of a packed weight, uint8 [tiles = N / 16, K / (32 S), 256 S + 64], S = 1 or 4 groups
// of 32 inputs sharing a scale: block (t, b) holds, for columns 16t..16t+15, the codes of its
// S groups g = S b .. S b + S - 1 (256 bytes each, inputs 32g..32g+31), then the 16 columns'
// float16 scales d (32 bytes), then their float16 minimums m (32 bytes), which every group of
// the block uses. The codes of a group form 8 "quads" j (inputs 32g+4j..32g+4j+3) of 64 codes
// each, code of (column c, input 4j+i) at byte 4c+i of the quad; bytes p (0..63) of chunk q
// (0..3) hold quad q in the low nibble and quad q+4 in the high nibble. A weight is
// w = d * code + m, code in 0..15. S = 1 (5 bits a weight) is the format of every model;
// S = 4 (4.25 bits) a draft model's, 15% fewer bytes a step (specdec.backends.quant.int4).
// The arithmetic above is the same for both: each group's sum meets its block's d and m.

// ATen's tensor and the two factories only: torch/extension.h (pybind, the whole C++ API)
// took 31 s to parse per file on a 2-core EPYC, and only layer_stack.cpp, which binds the
// module, needs it (the kernel builds on a user's first run).
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/Parallel.h>
#include <cpuid.h>
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "lanes.h"

namespace {

constexpr int kGroup = 32;
constexpr int kTile = 16;
constexpr int kCodeBytes = 256;  // a group's codes for a tile

// Where group g's codes and its block's scales lie in a tile's blocks, S groups a block.
template <int S>
struct Layout {
  static constexpr int kBlock = S * kCodeBytes + 64;  // codes, 16 float16 d, 16 float16 m
  static const uint8_t* codes(const uint8_t* blocks, int64_t g) {
    return blocks + (g / S) * kBlock + (g % S) * kCodeBytes;
  }
  static const uint8_t* scales(const uint8_t* blocks, int64_t g) {  // d, then m at +32
    return blocks + (g / S) * kBlock + S * kCodeBytes;
  }
};
constexpr int kRowsAvx512 = 8;  // rows a pass on AVX-512 (AVX2's: kRowsAvx2)

// The bytes kPrefetchGroups groups ahead (10 KB of S = 1 blocks) asked for now, five lines a
// group (a group's share of an S = 4 block is 272 bytes: a line is asked for twice at times).
// A thread's tiles lie one after another, so this runs on into its next tile; past the
// weight's end it asks for nothing that can fault (a prefetch is a hint). Only the time
// changes, not a bit.
// - Without it the hardware's prefetchers alone kept a pass of 5-16 rows waiting on memory:
//   on the family 26 EPYC (2 threads, a 1536 x 8960 weight from DRAM) passes of 8 rows took
//   0.36 ms and of 16 rows 0.71, with it 0.19-0.21 and 0.37-0.42 (distances 16-48 level; 4
//   and 8 about half the gain, 64 less): bench/results/2026-12-04-weight-prefetch-epyc-avx512.
// - Where into: L2 (prefetcht1) on Intel, L1 (prefetcht0) on every other CPU. An
//   Intel core holds few L1 misses in flight, and prefetches into L1 take those slots from the
//   kernel's own loads: on the AMX Xeon (family 6 model 167, 2 threads) a 1-row product of
//   that weight read from DRAM took 0.48-0.53 ms with prefetcht0 (16-18 GB/s of the 22.8 a
//   plain sum reads) and 0.40-0.41 ms with prefetcht1 (21 GB/s); 8 rows 0.57-0.64 -> 0.53-0.59
//   (bench/results/2026-12-05-prefetch-hint-xeon-amx). L1 is what measured best on the
//   family 26 EPYC, and Zen 4 is documented to drop prefetcht1 at times.
// - Except in the AVX-512 path's passes of several rows on the other CPUs: there the lines go
//   into L2 kPrefetchGroups ahead and into L1 kNearGroups ahead (``prefetch_two_levels``).
//   On the Zen 4 EPYC (family 25 model 17, 2 threads; both kernels in one process on the same
//   weights, interleaved; the same bits) the 1.5B's int4 linears took 3-18% less time for
//   2-6 rows (level at 1 row, level to 15% less at 8-16), and its whole passes after 128
//   tokens 5-11% less for 3-6 tokens (v(4) 1.18 -> 1.08, v(6) 1.47 -> 1.36). L2 alone gave
//   most of that; L1 distances 2-8 and L2 distances 32-64 measured level, and so did two
//   levels for one-row passes; spread as on Intel (into L1) gained little
//   (bench/results/2026-12-06-prefetch-rows-zen4-epyc-avx512). Not measured on the family
//   26 EPYC.
constexpr int kPrefetchGroups = 32;
constexpr int kNearGroups = 4;
constexpr int kPrefetchBytes = kPrefetchGroups * (kCodeBytes + 64);

bool prefetch_into_l2() {
  __builtin_cpu_init();
  return __builtin_cpu_is("intel");
}
const bool kPrefetchIntoL2 = prefetch_into_l2();  // once, when the module loads

constexpr int kPrefetchLines = (kCodeBytes + 64) / 64;  // a group's lines

// Line ``line`` of the group kPrefetchGroups ahead of ``codes``. Each hint is written out
// where it is used: with the address arithmetic in a helper taking the hint as a template
// parameter, GCC 12 merged the L2 and L1 branches into the L1 one and dropped the prefetches
// of Intel's spread passes (the library's prefetch instructions 510 -> 290).
inline void prefetch_line(const uint8_t* codes, int line) {
  // Arithmetic on the address as an integer: a pointer past the weight would be undefined.
  const auto* ahead = reinterpret_cast<const void*>(reinterpret_cast<uintptr_t>(codes) +
                                                    kPrefetchBytes + 64 * line);
  if (kPrefetchIntoL2) {
    __builtin_prefetch(ahead, 0, 2);
  } else {
    __builtin_prefetch(ahead, 0, 3);
  }
}

inline void prefetch_ahead(const uint8_t* codes) {
  for (int line = 0; line < kPrefetchLines; ++line) prefetch_line(codes, line);
}

// A group's lines kPrefetchGroups ahead into L2 and kNearGroups ahead into L1.
inline void prefetch_two_levels(const uint8_t* codes) {
  const uintptr_t at = reinterpret_cast<uintptr_t>(codes);
  for (int line = 0; line < kPrefetchLines; ++line) {
    __builtin_prefetch(reinterpret_cast<const void*>(at + kPrefetchBytes + 64 * line), 0, 2);
    __builtin_prefetch(
        reinterpret_cast<const void*>(at + kNearGroups * (kCodeBytes + 64) + 64 * line), 0, 3);
  }
}

// When: all of a group's lines before its products, except in the AVX-512 path's passes of
// several rows on Intel, where they are asked for one at a time between the products of the
// group's quads (``rows_avx512``): asked for at once, they kept the products waiting. On the
// AMX Xeon (family 6 model 167, 2 threads, weights from DRAM) 8 rows of the 1536 x 8960
// weight took 0.48-0.54 ms with the lines at once and 0.40-0.41 spread, and the 1.5B's verify
// passes after 128 tokens cost v(5) 1.37-1.40 -> 1.26-1.33, v(8) 1.57-1.60 -> 1.40-1.44 steps;
// one-row products are unchanged (bench/results/2026-12-05-prefetch-spread-xeon-amx). The
// other CPUs ask for a group's lines at once (``prefetch_two_levels`` in passes of several
// rows: see above). The AVX2 path asks as one-row passes do on every CPU: run on the Zen 4
// EPYC, two levels took it 0.88-0.98x the time at 2-8 rows and 0.93-1.04x at 12-16, but
// the CPUs that run it (AVX2 only) were not there to measure.

// A pass's activations, quantized, laid out group by group: a kernel reaches every row of a
// group from one address (row r at a fixed offset: no register a row for the compiler to
// spill), and the 16 rows of a group that a tile takes are 512 contiguous bytes.
struct Activations {
  const int8_t* codes;   // [G, rows, 32]: group g of row r at (g * rows + r) * 32
  const float* scales;   // [G, rows, 2]: its da and das at (g * rows + r) * 2
  int64_t rows;
  int64_t groups;

  const int8_t* group_codes(int64_t g, int64_t r0) const {
    return codes + (g * rows + r0) * kGroup;
  }
  const float* group_scales(int64_t g, int64_t r0) const { return scales + (g * rows + r0) * 2; }
};

float half_to_float(uint16_t h) {
  // Exact IEEE binary16 -> binary32 (every half is a float); no rounding involved.
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exponent = (h >> 10) & 0x1f;
  uint32_t mantissa = h & 0x3ff;
  uint32_t bits;
  if (exponent == 0) {
    if (mantissa == 0) {
      bits = sign;
    } else {
      exponent = 127 - 15 + 1;
      while ((mantissa & 0x400) == 0) {
        mantissa <<= 1;
        exponent -= 1;
      }
      mantissa &= 0x3ff;
      bits = sign | (exponent << 23) | (mantissa << 13);
    }
  } else if (exponent == 0x1f) {
    bits = sign | 0x7f800000 | (mantissa << 13);
  } else {
    bits = sign | ((exponent + 127 - 15) << 23) | (mantissa << 13);
  }
  float out;
  std::memcpy(&out, &bits, sizeof(out));
  return out;
}

// One row's int8 codes per group of 32: da = max|x| / 127, code = nearest(x * (127 / max|x|)),
// rounded half to even. Written in GCC's vector extensions, 8 lanes at a time: a maximum, a
// product and a rounding per element, the same in any lane order, so every clone (AVX-512,
// AVX2, baseline) gives the same codes (measured: the scalar loop this replaces spent 45 us
// on one 8960-wide row, about 1.9 ms of every step of the 1.5B, and as much again per extra
// row of a verify pass).
constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: x + kRound - kRound rounds |x| < 2^22

// In the layout of Activations for a pass of ``rows`` rows: group g's codes go to
// codes + g * rows * 32, its da and das to scales[g * rows * 2] and the float after it.
SPECDEC_CLONES void quantize_row(const float* x, int64_t k, int8_t* codes, float* scales,
                                 int64_t rows) {
  for (int64_t g = 0; g < k / kGroup; ++g) {
    F8 v[kGroup / 8];
    std::memcpy(v, x + g * kGroup, sizeof(v));
    F8 top = {};
    I8 finite = {};
    finite -= 1;  // all bits set: every lane finite so far
    for (const F8& lane : v) {
      const F8 magnitude = (F8)((I8)lane & 0x7fffffff);
      top = magnitude > top ? magnitude : top;  // a NaN never wins: checked on its own
      finite &= (lane - lane) == 0;             // inf - inf and NaN - NaN are NaN
    }
    float amax = 0.0f;
    bool all_finite = true;
    for (int i = 0; i < 8; ++i) {
      amax = top[i] > amax ? top[i] : amax;
      all_finite = all_finite && finite[i] != 0;
    }
    int32_t sum = 0;
    float da;
    if (amax > 0.0f && all_finite) {
      const float inverse = 127.0f / amax;
      I8 total = {};
      for (int j = 0; j < kGroup / 8; ++j) {
        F8 q = (v[j] * inverse + kRound) - kRound;
        q = q > 127.0f ? F8{} + 127.0f : q;
        q = q < -127.0f ? F8{} - 127.0f : q;
        const I8 n = __builtin_convertvector(q, I8);
        total += n;
        for (int i = 0; i < 8; ++i) {
          codes[g * rows * kGroup + 8 * j + i] = static_cast<int8_t>(n[i]);
        }
      }
      for (int i = 0; i < 8; ++i) sum += total[i];
      da = amax / 127.0f;
    } else {  // all zero, or a NaN / infinity there: the row's outputs become NaN, as in float
      std::memset(codes + g * rows * kGroup, 0, kGroup);
      da = all_finite ? 0.0f : std::numeric_limits<float>::quiet_NaN();
    }
    scales[g * rows * 2] = da;
    scales[g * rows * 2 + 1] = da * static_cast<float>(sum);
  }
}

// ---------------------------------------------------------------- scalar (the reference)

template <int S>
void tile_scalar(const uint8_t* blocks, const Activations& a, int64_t row0, int64_t rows,
                 const float* bias, float* out, int64_t n_total, int64_t col0) {
  for (int64_t r = row0; r < row0 + rows; ++r) {
    float acc[kTile] = {};
    for (int64_t g = 0; g < a.groups; ++g) {
      const uint8_t* block = Layout<S>::codes(blocks, g);
      const uint16_t* d = reinterpret_cast<const uint16_t*>(Layout<S>::scales(blocks, g));
      const uint16_t* m = d + kTile;
      const int8_t* x = a.group_codes(g, r);
      const float da = a.group_scales(g, r)[0];
      const float das = a.group_scales(g, r)[1];
      for (int c = 0; c < kTile; ++c) {
        int32_t isum = 0;
        for (int j = 0; j < 8; ++j) {
          for (int i = 0; i < 4; ++i) {
            const uint8_t byte = block[(j % 4) * 64 + 4 * c + i];
            const int32_t code = j < 4 ? (byte & 0x0f) : (byte >> 4);
            isum += code * static_cast<int32_t>(x[4 * j + i]);
          }
        }
        const float t = static_cast<float>(isum) * half_to_float(d[c]);
        acc[c] = std::fma(t, da, acc[c]);
        acc[c] = std::fma(half_to_float(m[c]), das, acc[c]);
      }
    }
    for (int c = 0; c < kTile; ++c) {
      out[r * n_total + col0 + c] = bias ? acc[c] + bias[col0 + c] : acc[c];
    }
  }
}

// ---------------------------------------------------------------- AVX2 (8 columns a register)

// R rows at once over a whole tile (16 columns: two registers of 8), unrolled like the
// AVX-512 path. Each activation quad is broadcast once for both halves of the tile, and a
// group's products of a row (maddubs: code x activation, two inputs a lane, 16 of them) are
// summed in int16 and widened once per half: a lane holds at most 8 x 2 x 15 x 127 = 30,480
// < 2^15, so the int16 sum is exact and equals the int32 sum of the widened products (the
// same isum, the same bits). Against the first version (one half at a time, every product
// widened), on an AVX-512 EPYC running this path: a whole pass of the 1.5B 0.66-0.77x the
// time for 1 row, 0.55-0.59x for 4, 0.63-0.70x for 32 (`python bench/int4_rows.py --path
// avx2`, docs/notes/runtime-search.md section 7).
template <int R, int S>
__attribute__((target("avx2,fma,f16c"))) inline void rows_avx2(const uint8_t* blocks,
                                                            const Activations& a, int64_t r0,
                                                            const float* bias, float* out,
                                                            int64_t n_total, int64_t col0) {
  const __m256i low_nibbles = _mm256_set1_epi8(0x0f);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
  for (int64_t g = 0; g < a.groups; ++g) {
    const uint8_t* block = Layout<S>::codes(blocks, g);
    const uint8_t* scales = Layout<S>::scales(blocks, g);
    const int8_t* x = a.group_codes(g, r0);  // row r0 + r at x + 32 r
    const float* row_scales = a.group_scales(g, r0);
    prefetch_ahead(block);
    __m256i isum[R][2];
    for (int r = 0; r < R; ++r) isum[r][0] = isum[r][1] = _mm256_setzero_si256();
    for (int q = 0; q < 4; ++q) {
      const __m256i p0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + q * 64));
      const __m256i p1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + q * 64 + 32));
      const __m256i lo0 = _mm256_and_si256(p0, low_nibbles);
      const __m256i lo1 = _mm256_and_si256(p1, low_nibbles);
      const __m256i hi0 = _mm256_and_si256(_mm256_srli_epi16(p0, 4), low_nibbles);
      const __m256i hi1 = _mm256_and_si256(_mm256_srli_epi16(p1, 4), low_nibbles);
      for (int r = 0; r < R; ++r) {
        int32_t qlo, qhi;
        std::memcpy(&qlo, x + r * kGroup + 4 * q, 4);
        std::memcpy(&qhi, x + r * kGroup + 16 + 4 * q, 4);
        const __m256i blo = _mm256_set1_epi32(qlo);
        const __m256i bhi = _mm256_set1_epi32(qhi);
        isum[r][0] = _mm256_add_epi16(isum[r][0], _mm256_maddubs_epi16(lo0, blo));
        isum[r][1] = _mm256_add_epi16(isum[r][1], _mm256_maddubs_epi16(lo1, blo));
        isum[r][0] = _mm256_add_epi16(isum[r][0], _mm256_maddubs_epi16(hi0, bhi));
        isum[r][1] = _mm256_add_epi16(isum[r][1], _mm256_maddubs_epi16(hi1, bhi));
        // Integer sums may be reordered, and GCC does: without this it computes all 64 of a
        // group's products first, spills them to the stack and adds them up after (the
        // same sums, 1.4x the time at 64 rows). An empty asm that reads and writes the sums
        // keeps each add in place and the sums in registers; it emits no instruction.
        asm("" : "+x"(isum[r][0]), "+x"(isum[r][1]));
      }
    }
    for (int h = 0; h < 2; ++h) {
      const __m256 d = _mm256_cvtph_ps(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + h * 16)));
      const __m256 m = _mm256_cvtph_ps(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + 32 + h * 16)));
      for (int r = 0; r < R; ++r) {
        const __m256 t = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(isum[r][h], ones)), d);
        acc[r][h] = _mm256_fmadd_ps(t, _mm256_set1_ps(row_scales[2 * r]), acc[r][h]);
        acc[r][h] = _mm256_fmadd_ps(m, _mm256_set1_ps(row_scales[2 * r + 1]), acc[r][h]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int h = 0; h < 2; ++h) {
      __m256 result = acc[r][h];
      const int64_t col = col0 + h * 8;
      if (bias) result = _mm256_add_ps(result, _mm256_loadu_ps(bias + col));
      _mm256_storeu_ps(out + (r0 + r) * n_total + col, result);
    }
  }
}

template <int R, int S>
__attribute__((target("avx2,fma,f16c"))) void rows_avx2_call(const uint8_t* blocks,
                                                          const Activations& a, int64_t r0,
                                                          const float* bias, float* out,
                                                          int64_t n_total, int64_t col0) {
  rows_avx2<R, S>(blocks, a, r0, bias, out, n_total, col0);
}

// Rows in passes of at most kRowsAvx2 (the block's weights come again from cache for the
// next pass): a quad's four code registers and the rows' eight int16 sums fit AVX2's 16
// registers; passes of 2 or 3 (and of 5, before the asm line above) measured no faster.
constexpr int kRowsAvx2 = 4;

template <int S>
__attribute__((target("avx2,fma,f16c"))) void tile_avx2(const uint8_t* blocks,
                                                       const Activations& a, int64_t row0,
                                                       int64_t rows, const float* bias,
                                                       float* out, int64_t n_total,
                                                       int64_t col0) {
  using RowsFn = void (*)(const uint8_t*, const Activations&, int64_t, const float*, float*,
                          int64_t, int64_t);
  static constexpr RowsFn by_count[kRowsAvx2 + 1] = {
      nullptr, rows_avx2_call<1, S>, rows_avx2_call<2, S>, rows_avx2_call<3, S>,
      rows_avx2_call<4, S>,
  };
  for (int64_t r0 = row0; r0 < row0 + rows; r0 += kRowsAvx2) {
    const int64_t n = std::min<int64_t>(kRowsAvx2, row0 + rows - r0);
    by_count[n](blocks, a, r0, bias, out, n_total, col0);
  }
}

// ---------------------------------------------------------------- AVX-512 VNNI (16 columns)

// dpbusd with the activation quad broadcast straight from memory (EVEX {1to16}): one
// instruction instead of a broadcast and a product (GCC does not fold it by itself).
__attribute__((target("avx512f,avx512vnni"))) inline __m512i dpbusd_broadcast(
    __m512i acc, __m512i codes, const int8_t* quad) {
  asm("vpdpbusd %[quad]%{1to16%}, %[codes], %[acc]"
      : [acc] "+v"(acc)
      : [codes] "v"(codes), [quad] "m"(*reinterpret_cast<const int32_t*>(quad)));
  return acc;
}

// The float epilogue of one group for R rows, from their integer sums: every path with
// AVX-512 (VNNI, AMX) runs this one, so their roundings are the same by construction.
template <int R>
__attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c"))) inline void group_epilogue(
    const uint8_t* scales, const __m512i* isum, const Activations& a, int64_t r0, int64_t g,
    __m512* acc) {
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales)));
  const __m512 m =
      _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + 32)));
  const float* row_scales = a.group_scales(g, r0);
  for (int r = 0; r < R; ++r) {
    const __m512 t = _mm512_mul_ps(_mm512_cvtepi32_ps(isum[r]), d);
    acc[r] = _mm512_fmadd_ps(t, _mm512_set1_ps(row_scales[2 * r]), acc[r]);
    acc[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(row_scales[2 * r + 1]), acc[r]);
  }
}

// R rows at once, unrolled, so that their independent chains overlap; every row meets the
// same instructions in the same order whatever R is.
template <int R, int S>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c"))) inline void rows_avx512(
    const uint8_t* blocks, const Activations& a, int64_t r0, const float* bias, float* out,
    int64_t n_total, int64_t col0) {
  const __m512i low_nibbles = _mm512_set1_epi8(0x0f);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  const bool spread = R > 1 && kPrefetchIntoL2;  // the lines between the quads (see above)
  const bool two_levels = R > 1 && !kPrefetchIntoL2;
  for (int64_t g = 0; g < a.groups; ++g) {
    const uint8_t* block = Layout<S>::codes(blocks, g);
    const int8_t* x = a.group_codes(g, r0);  // row r0 + r at x + 32 r
    if (two_levels) {
      prefetch_two_levels(block);
    } else if (!spread) {
      prefetch_ahead(block);
    }
    __m512i codes[8];
    for (int q = 0; q < 4; ++q) {
      const __m512i packed = _mm512_loadu_si512(block + q * 64);
      codes[q] = _mm512_and_si512(packed, low_nibbles);
      codes[q + 4] = _mm512_and_si512(_mm512_srli_epi16(packed, 4), low_nibbles);
    }
    __m512i isum[R];
    for (int r = 0; r < R; ++r) isum[r] = _mm512_setzero_si512();
    for (int j = 0; j < 8; ++j) {
      if (spread && j < kPrefetchLines) prefetch_line(block, j);
      for (int r = 0; r < R; ++r) {
        isum[r] = dpbusd_broadcast(isum[r], codes[j], x + r * kGroup + 4 * j);
      }
    }
    group_epilogue<R>(Layout<S>::scales(blocks, g), isum, a, r0, g, acc);
  }
  for (int r = 0; r < R; ++r) {
    __m512 result = acc[r];
    if (bias) result = _mm512_add_ps(result, _mm512_loadu_ps(bias + col0));
    _mm512_storeu_ps(out + (r0 + r) * n_total + col0, result);
  }
}

template <int R, int S>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c"))) void rows_avx512_call(
    const uint8_t* blocks, const Activations& a, int64_t r0, const float* bias, float* out,
    int64_t n_total, int64_t col0) {
  rows_avx512<R, S>(blocks, a, r0, bias, out, n_total, col0);
}

template <int S>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,fma,f16c"))) void tile_avx512(
    const uint8_t* blocks, const Activations& a, int64_t row0, int64_t rows, const float* bias,
    float* out, int64_t n_total, int64_t col0) {
  using RowsFn = void (*)(const uint8_t*, const Activations&, int64_t, const float*, float*,
                          int64_t, int64_t);
  static constexpr RowsFn by_count[kRowsAvx512 + 1] = {
      nullptr,
      rows_avx512_call<1, S>,
      rows_avx512_call<2, S>,
      rows_avx512_call<3, S>,
      rows_avx512_call<4, S>,
      rows_avx512_call<5, S>,
      rows_avx512_call<6, S>,
      rows_avx512_call<7, S>,
      rows_avx512_call<8, S>,
  };
  for (int64_t r0 = row0; r0 < row0 + rows; r0 += kRowsAvx512) {
    const int64_t n = std::min<int64_t>(kRowsAvx512, row0 + rows - r0);
    by_count[n](blocks, a, r0, bias, out, n_total, col0);
  }
}

// ---------------------------------------------------------------- AMX-INT8 (16 rows a tile)

// Sapphire Rapids and later Xeons multiply int8 tiles: one TDPBSSD takes a tile of up to 16
// rows of 64 bytes (here: a pass's activation codes for one group, 16 rows x 32 inputs)
// against a tile of 16 rows of 64 bytes (the group's codes, 8 quads x 16 columns x 4
// inputs: the packed layout's quads as they are unpacked) and adds 16 x 16 int32 dot
// products into a third tile. Those are the same exact integer sums isum the VNNI path
// makes one row at a time (codes 0..15 are the same as signed or unsigned bytes), stored and
// read back for the VNNI path's own epilogue (group_epilogue), so every (row, column) gets
// the same bits as on the other paths. What it saves is the per-row integer work: a group of a
// 16-column tile costs one tile product for up to 16 rows instead of 8 dpbusd a row.
// The per-group scales keep a tile product to K = 32 and cost a store and the float epilogue
// per group, so tiles pay only for many rows: passes of kAmxPass rows or more run on tiles in
// pieces of 16 (a last piece of under kAmxFewest on the VNNI path), smaller passes on the
// VNNI path (bench/results/2026-12-03-int4-amx-xeon-amx: a tile's fixed cost per group is
// about that of 12 rows' dpbusd, and whole passes of under 32 rows measured no faster).
constexpr int kRowsAmx = 16;
constexpr int kAmxFewest = 13;
constexpr int kAmxPass = 32;

// The tile configuration (palette 1): tiles 0-3 sums [R rows, 16 int32], 4-5 activations
// [R rows, 32 bytes], 6-7 codes [8 rows, 64 bytes], so that four groups' products are in
// flight at once.
struct alignas(64) TileConfig {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};

// A group's codes as the tile of 8 quads x 64 bytes (byte 4c + i of quad j: column c, input
// 4j + i), the layout TDPBSSD takes for its second operand.
__attribute__((target("avx512f,avx512bw"))) inline void group_codes(const uint8_t* block,
                                                                    uint8_t* quads) {
  const __m512i low_nibbles = _mm512_set1_epi8(0x0f);
  for (int q = 0; q < 4; ++q) {
    const __m512i packed = _mm512_loadu_si512(block + q * 64);
    _mm512_store_si512(quads + q * 64, _mm512_and_si512(packed, low_nibbles));
    _mm512_store_si512(quads + (q + 4) * 64,
                       _mm512_and_si512(_mm512_srli_epi16(packed, 4), low_nibbles));
  }
}

// The integer sums of one group into tiles C (zeroed), A, B: immediates, hence a macro.
#define SPECDEC_GROUP_PRODUCT(C, A, B, x, quads, stride, isum) \
  do {                                                         \
    _tile_zero(C);                                             \
    _tile_loadd(A, x, stride);                                 \
    _tile_loadd(B, quads, 64);                                 \
    _tile_dpbssd(C, A, B);                                     \
    _tile_stored(C, isum, 64);                                 \
  } while (0)

// Groups a batch: their codes unpacked, then their tile products, then their epilogues in
// group order, so that the tile unit's latency overlaps the unpacking and the float work.
constexpr int kAmxBatch = 8;

// The integer sums of groups g0 .. g0 + kAmxBatch - 1 (fewer at the end) for rows r0 ..
// r0 + R - 1 into sums[j], R rows of 16 int32 each, on tiles configured by rows_amx.
template <int R, int S>
__attribute__((target("avx512f,avx512bw,amx-tile,amx-int8"), always_inline)) inline void
amx_products(const uint8_t* blocks, const Activations& a, int64_t r0, int64_t g0,
             uint8_t (*quads)[8 * 64], int32_t (*sums)[R * 16]) {
  const int n = static_cast<int>(std::min<int64_t>(kAmxBatch, a.groups - g0));
  for (int j = 0; j < n; ++j) {
    prefetch_ahead(Layout<S>::codes(blocks, g0 + j));  // as the VNNI path does
    group_codes(Layout<S>::codes(blocks, g0 + j), quads[j]);
  }
  // Group g's R rows: R x 32 contiguous bytes, a.rows x 32 bytes after group g - 1's.
  const int64_t group_stride = a.rows * kGroup;
  const int8_t* x = a.group_codes(g0, r0);
  int j = 0;
  for (; j + 3 < n; j += 4) {
    const int8_t* xj = x + j * group_stride;
    SPECDEC_GROUP_PRODUCT(0, 4, 6, xj, quads[j], kGroup, sums[j]);
    SPECDEC_GROUP_PRODUCT(1, 5, 7, xj + group_stride, quads[j + 1], kGroup, sums[j + 1]);
    SPECDEC_GROUP_PRODUCT(2, 4, 6, xj + 2 * group_stride, quads[j + 2], kGroup, sums[j + 2]);
    SPECDEC_GROUP_PRODUCT(3, 5, 7, xj + 3 * group_stride, quads[j + 3], kGroup, sums[j + 3]);
  }
  for (; j < n; ++j) {
    SPECDEC_GROUP_PRODUCT(0, 4, 6, x + j * group_stride, quads[j], kGroup, sums[j]);
  }
}

template <int R, int S>
__attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c,amx-tile,amx-int8"))) void rows_amx(
    const uint8_t* blocks, const Activations& a, int64_t r0, const float* bias, float* out,
    int64_t n_total, int64_t col0) {
  // Configured here for this piece and released at its end, with no call in between: a call
  // into glibc's thread-local lookup between the configuration and the first tile instruction
  // was seen to leave the tiles unconfigured (SIGILL), so no state is kept across calls.
  TileConfig config;
  for (int t = 0; t < 4; ++t) config.rows[t] = R, config.bytes_per_row[t] = 64;
  for (int t = 4; t < 6; ++t) config.rows[t] = R, config.bytes_per_row[t] = kGroup;
  for (int t = 6; t < 8; ++t) config.rows[t] = kGroup / 4, config.bytes_per_row[t] = 64;
  _tile_loadconfig(&config);
  alignas(64) uint8_t quads[kAmxBatch][8 * 64];
  alignas(64) int32_t isum[2][kAmxBatch][R * 16];
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  // The products of batch b + 1 are issued before the epilogues of batch b, so that the tile
  // unit works while the vector units do the float work.
  amx_products<R, S>(blocks, a, r0, 0, quads, isum[0]);
  for (int64_t g0 = 0, b = 0; g0 < a.groups; g0 += kAmxBatch, ++b) {
    if (g0 + kAmxBatch < a.groups) {
      amx_products<R, S>(blocks, a, r0, g0 + kAmxBatch, quads, isum[(b + 1) % 2]);
    }
    const int n = static_cast<int>(std::min<int64_t>(kAmxBatch, a.groups - g0));
    for (int j = 0; j < n; ++j) {
      __m512i sums[R];
      for (int r = 0; r < R; ++r) sums[r] = _mm512_load_si512(isum[b % 2][j] + 16 * r);
      group_epilogue<R>(Layout<S>::scales(blocks, g0 + j), sums, a, r0, g0 + j, acc);
    }
  }
  _tile_release();  // leaves no configuration behind for other code on this thread
  for (int r = 0; r < R; ++r) {
    __m512 result = acc[r];
    if (bias) result = _mm512_add_ps(result, _mm512_loadu_ps(bias + col0));
    _mm512_storeu_ps(out + (r0 + r) * n_total + col0, result);
  }
}
#undef SPECDEC_GROUP_PRODUCT

template <int S>
void tile_amx(const uint8_t* blocks, const Activations& a, int64_t row0, int64_t rows,
              const float* bias, float* out, int64_t n_total, int64_t col0) {
  using RowsFn = void (*)(const uint8_t*, const Activations&, int64_t, const float*, float*,
                          int64_t, int64_t);
  static constexpr RowsFn by_count[kRowsAmx - kAmxFewest + 1] = {
      rows_amx<13, S>, rows_amx<14, S>, rows_amx<15, S>, rows_amx<16, S>};
  static_assert(kAmxFewest == 13, "by_count starts at kAmxFewest");
  if (rows < kAmxPass) return tile_avx512<S>(blocks, a, row0, rows, bias, out, n_total, col0);
  for (int64_t r0 = row0; r0 < row0 + rows; r0 += kRowsAmx) {
    const int64_t n = std::min<int64_t>(kRowsAmx, row0 + rows - r0);
    if (n < kAmxFewest) {
      tile_avx512<S>(blocks, a, r0, n, bias, out, n_total, col0);
    } else {
      by_count[n - kAmxFewest](blocks, a, r0, bias, out, n_total, col0);
    }
  }
}

// Whether this CPU has AMX-INT8 and Linux lets this process use its tile registers (asked
// once: a process must request the tile data state before its first tile instruction).
bool amx_usable() {
  static const bool usable = [] {
    unsigned eax, ebx, ecx, edx;
    if (!__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx)) return false;
    const bool tile = (edx >> 24) & 1, int8 = (edx >> 25) & 1;
    constexpr long kRequestPermission = 0x1023;  // ARCH_REQ_XCOMP_PERM
    constexpr long kTileData = 18;               // XFEATURE_XTILEDATA
    return tile && int8 && syscall(SYS_arch_prctl, kRequestPermission, kTileData) == 0;
  }();
  return usable;
}

using TileFn = void (*)(const uint8_t*, const Activations&, int64_t, int64_t, const float*,
                        float*, int64_t, int64_t);

// 0: scalar, 1: AVX2, 2: AVX-512 VNNI, 3: AMX-INT8 (passes of 32+ rows; smaller ones VNNI).
int best_path() {
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni")) {
    return amx_usable() ? 3 : 2;
  }
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return 1;
  return 0;
}

template <int S>
TileFn tile_fn_of(int64_t path) {
  switch (path) {
    case 3:
      return tile_amx<S>;
    case 2:
      return tile_avx512<S>;
    case 1:
      return tile_avx2<S>;
    default:
      return tile_scalar<S>;
  }
}

// scale_groups: S, the groups of a block (1 or 4).
TileFn tile_fn(int64_t path, int64_t scale_groups) {
  const int best = best_path();
  TORCH_CHECK(path >= -1 && path <= best, "int4 path ", path, " is not available on this CPU");
  const int64_t chosen = path < 0 ? best : path;
  return scale_groups == 4 ? tile_fn_of<4>(chosen) : tile_fn_of<1>(chosen);
}

}  // namespace

// x  # [rows, K] float32; packed  # [N / 16, K / (32 S), 256 S + 64] uint8 (S = 1 or 4 groups
// a block, read from its last size); bias  # [N] float32 or None
at::Tensor int4_linear(at::Tensor x, at::Tensor packed, c10::optional<at::Tensor> bias,
                          int64_t path) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat, "x: [rows, K] float32");
  TORCH_CHECK(packed.dim() == 3 && packed.scalar_type() == at::kByte &&
                  (packed.size(2) == Layout<1>::kBlock || packed.size(2) == Layout<4>::kBlock) &&
                  packed.is_contiguous(),
              "packed: [N / 16, K / 32, 320] or [N / 16, K / 128, 1088] uint8, contiguous");
  const int64_t scale_groups = packed.size(2) == Layout<4>::kBlock ? 4 : 1;
  const int64_t rows = x.size(0), k = x.size(1);
  const int64_t tiles = packed.size(0), groups = packed.size(1) * scale_groups;
  TORCH_CHECK(k == groups * kGroup, "x has ", k, " inputs, the weight ", groups * kGroup);
  const int64_t n_total = tiles * kTile;
  const float* bias_data = nullptr;
  at::Tensor bias_tensor;
  if (bias.has_value() && bias->defined()) {
    bias_tensor = bias->contiguous();
    TORCH_CHECK(bias_tensor.scalar_type() == at::kFloat && bias_tensor.numel() == n_total,
                "bias: [N] float32");
    bias_data = bias_tensor.data_ptr<float>();
  }
  const TileFn tile = tile_fn(path, scale_groups);
  const int64_t tile_bytes = packed.size(1) * packed.size(2);
  const at::Tensor input = x.contiguous();
  std::vector<int8_t> codes(rows * k);
  std::vector<float> scales(rows * groups * 2);
  const float* in = input.data_ptr<float>();
  at::parallel_for(0, rows, 1, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      quantize_row(in + r * k, k, codes.data() + r * kGroup, scales.data() + r * 2, rows);
    }
  });
  const Activations a{codes.data(), scales.data(), rows, groups};
  at::Tensor out = at::empty({rows, n_total}, x.options());
  float* out_data = out.data_ptr<float>();
  const uint8_t* weights = packed.data_ptr<uint8_t>();
  at::parallel_for(0, tiles, 1, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      tile(weights + t * tile_bytes, a, 0, rows, bias_data, out_data, n_total, t * kTile);
    }
  });
  return out;
}

int64_t int4_best_path() { return best_path(); }
