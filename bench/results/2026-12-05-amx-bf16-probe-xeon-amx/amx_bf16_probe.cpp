// An int4 product on AMX-BF16: each group of 32 inputs of 16 output columns dequantized to
// bfloat16 (a table of the group's 16 values, vpermw) into an A tile, the pass's activations
// as bfloat16 B tiles (up to 16 rows each), C = W^T X^T accumulated over all groups in tiles.
// Each output is one tile element's dot product, so a row's result should not depend on how
// many rows the pass has. Checks that property (each row alone against the same row in passes
// of 1-64 rows, bit for bit) and the error against a double sum over the same bfloat16 values,
// then times a product of two of the 1.5B's shapes for 1..64 rows over COPIES copies (5 bits a
// weight as specdec's int4 form: 256 bytes of codes, 16 float16 d and 16 m a block).
// g++ -O2 -fopenmp -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 -mamx-tile \
//     -mamx-bf16 -mf16c -mfma -o amx_bf16_probe amx_bf16_probe.cpp
//   MODE 0 all, 1 dequantize only (no tiles), 2 tiles only (no dequantizing)
//   LAYOUT 0: a column's 32 codes in 16 bytes (k, k + 16); 1: a column pair's in 32 bytes
//   PREFETCH: blocks ahead (prefetcht1); PIPE 1: the next block dequantized before this one's
//   tile load (two A buffers; LAYOUT 1 only); ALT 1: A and B tile registers alternate;
//   QUAD 1 (with LAYOUT 1, passes of up to 16 rows): four column blocks at a time, four C
//   tiles summing independently, one B tile load for the four; AHEAD 1 (with QUAD): the
//   blocks' float16 scales converted to float one group ahead (not read back from a store
//   just made)
// OMP_NUM_THREADS=2 ./amx_bf16_probe COPIES MODE LAYOUT PREFETCH PIPE ALT QUAD AHEAD
#include <immintrin.h>
#include <omp.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>
#include <tuple>

struct alignas(64) Cfg { uint8_t palette = 1, start = 0, res[14] = {}; uint16_t bpr[16] = {}; uint8_t rows[16] = {}; };

int LAYOUT = 0;
struct Weight {  // K inputs, N outputs; per 16-column block, per group of 32: codes, d, m
  int K, N, G;
  std::vector<uint8_t, std::allocator<uint8_t>> blob;  // [N/16][G] x 320 bytes
  size_t block_bytes() const { return 320; }
  const uint8_t* at(int cb, int g) const { return blob.data() + (size_t(cb) * G + g) * 320; }
};

static uint16_t bf(float x) { uint32_t u; memcpy(&u, &x, 4); u += 0x7fff + ((u >> 16) & 1); return uint16_t(u >> 16); }
static float fbf(uint16_t b) { uint32_t u = uint32_t(b) << 16; float x; memcpy(&x, &u, 4); return x; }

Weight make_weight(int K, int N, std::mt19937& g, std::vector<float>& dense) {
  Weight w{K, N, K / 32, {}};
  w.blob.assign(size_t(N / 16) * w.G * 320 + 64, 0);
  dense.assign(size_t(K) * N, 0);
  std::uniform_int_distribution<int> q(0, 15);
  std::uniform_real_distribution<float> s(0.001f, 0.02f);
  for (int cb = 0; cb < N / 16; cb++)
    for (int gi = 0; gi < w.G; gi++) {
      uint8_t* p = w.blob.data() + (size_t(cb) * w.G + gi) * 320;
      uint16_t* dm = (uint16_t*)(p + 256);
      for (int c = 0; c < 16; c++) {
        float d = s(g), m = 8 * d;
        dm[c] = _cvtss_sh(d, 0); dm[16 + c] = _cvtss_sh(m, 0);
        float dd = _cvtsh_ss(dm[c]), mm = _cvtsh_ss(dm[16 + c]);
        for (int k = 0; k < 32; k++) {
          int v = q(g);
          if (LAYOUT == 1) p[(c / 2) * 32 + k] |= uint8_t(c % 2 ? v << 4 : v);
          else if (k < 16) p[c * 16 + k] |= uint8_t(v); else p[c * 16 + k - 16] |= uint8_t(v << 4);
          dense[size_t(gi * 32 + k) * N + cb * 16 + c] = fbf(bf(dd * v - mm));
        }
      }
    }
  return w;
}

// X [M][K] float -> B tiles [G][MB][16 pairs][16 rows][2] bf16 (rows past M zero)
void pack_x(const float* x, int M, int K, uint16_t* xt) {
  int G = K / 32, MB = (M + 15) / 16;
  memset(xt, 0, size_t(G) * MB * 1024);
  for (int m = 0; m < M; m++)
    for (int k = 0; k < K; k++) {
      int g = k / 32, kk = k % 32, mb = m / 16, mm = m % 16;
      xt[((size_t(g) * MB + mb) * 16 + kk / 2) * 32 + mm * 2 + kk % 2] = bf(x[size_t(m) * K + k]);
    }
}

__attribute__((always_inline)) inline void dequant(const uint8_t* p, uint16_t* a /* [16][32] */) {
  const __m512 qs = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(p + 256)));
  __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(p + 288)));
  alignas(64) float ds[16], ms[16];
  _mm512_store_ps(ds, d); _mm512_store_ps(ms, m);
  const __m512i lo_mask = _mm512_set1_epi16(0x0f);
  const __m512i hi_half = _mm512_setr_epi64(0, 0, 0, 0, 0x0010001000100010LL, 0x0010001000100010LL, 0x0010001000100010LL, 0x0010001000100010LL);
  for (int c = 0; c < 16; c += 2) {
    __m512 t0 = _mm512_fmsub_ps(qs, _mm512_set1_ps(ds[c]), _mm512_set1_ps(ms[c]));
    __m512 t1 = _mm512_fmsub_ps(qs, _mm512_set1_ps(ds[c + 1]), _mm512_set1_ps(ms[c + 1]));
    __m512i table = (__m512i)_mm512_cvtne2ps_pbh(t1, t0);  // words 0-15: column c, 16-31: c+1
    for (int j = 0; j < 2; j++) {
      __m256i bytes = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i*)(p + (c + j) * 16)));
      __m512i both = _mm512_inserti64x4(_mm512_castsi256_si512(bytes), _mm256_srli_epi16(bytes, 4), 1);
      __m512i idx = _mm512_and_si512(both, lo_mask);
      if (j) idx = _mm512_or_si512(idx, _mm512_set1_epi16(16));
      _mm512_store_si512((__m512i*)(a + (c + j) * 32), _mm512_permutexvar_epi16(idx, table));
    }
  }
  (void)hi_half;
}


__attribute__((always_inline)) inline void dequant2(const uint8_t* p, uint16_t* a /* [16][32] */) {
  const __m512 qs = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  alignas(64) float dm[32];
  _mm512_store_ps(dm, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(p + 256))));
  _mm512_store_ps(dm + 16, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(p + 288))));
  const __m512i lo_mask = _mm512_set1_epi16(0x0f), high_half = _mm512_set1_epi16(0x10);
#pragma GCC unroll 8
  for (int pr = 0; pr < 8; pr++) {
    int c = 2 * pr;
    __m512 even = _mm512_fmsub_ps(qs, _mm512_set1_ps(dm[c]), _mm512_set1_ps(dm[16 + c]));
    __m512 odd = _mm512_fmsub_ps(qs, _mm512_set1_ps(dm[c + 1]), _mm512_set1_ps(dm[17 + c]));
    __m512i table = (__m512i)_mm512_cvtne2ps_pbh(even, odd);  // words 0-15: column c+1, 16-31: c
    __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(p + pr * 32)));
    __m512i ie = _mm512_ternarylogic_epi32(w, lo_mask, high_half, 0xEA);  // (w & 15) | 16
    __m512i io = _mm512_srli_epi16(w, 4);
    _mm512_store_si512((__m512i*)(a + c * 32), _mm512_permutexvar_epi16(ie, table));
    _mm512_store_si512((__m512i*)(a + (c + 1) * 32), _mm512_permutexvar_epi16(io, table));
  }
}


__attribute__((always_inline)) inline void scales_ahead(const uint8_t* p, float* dm) {
  _mm512_store_ps(dm, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(p + 256))));
  _mm512_store_ps(dm + 16, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(p + 288))));
}
__attribute__((always_inline)) inline void dequant3(const uint8_t* p, const float* dm, uint16_t* a) {
  const __m512 qs = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i lo_mask = _mm512_set1_epi16(0x0f), high_half = _mm512_set1_epi16(0x10);
#pragma GCC unroll 8
  for (int pr = 0; pr < 8; pr++) {
    int c = 2 * pr;
    __m512 even = _mm512_fmsub_ps(qs, _mm512_set1_ps(dm[c]), _mm512_set1_ps(dm[16 + c]));
    __m512 odd = _mm512_fmsub_ps(qs, _mm512_set1_ps(dm[c + 1]), _mm512_set1_ps(dm[17 + c]));
    __m512i table = (__m512i)_mm512_cvtne2ps_pbh(even, odd);
    __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(p + pr * 32)));
    __m512i ie = _mm512_ternarylogic_epi32(w, lo_mask, high_half, 0xEA);
    __m512i io = _mm512_srli_epi16(w, 4);
    _mm512_store_si512((__m512i*)(a + c * 32), _mm512_permutexvar_epi16(ie, table));
    _mm512_store_si512((__m512i*)(a + (c + 1) * 32), _mm512_permutexvar_epi16(io, table));
  }
}

// y [M][N] = x W; M <= 64
int MODE = 0, PF = 32, PIPE = 0, ALT = 0, QUAD = 0, AHEAD = 0;
void product(const Weight& w, const uint16_t* xt, int M, float* y) {
  int MB = (M + 15) / 16, cols = std::min(M, 16);
#pragma omp parallel
  {
    Cfg cfg;
    cfg.rows[0] = 16; cfg.bpr[0] = 64;                      // A: 16 columns x 32 inputs
    cfg.rows[1] = 16; cfg.bpr[1] = uint16_t(cols * 4);      // B: 16 pairs x rows
    cfg.rows[6] = 16; cfg.bpr[6] = uint16_t(cols * 4); cfg.rows[7] = 16; cfg.bpr[7] = 64;
    for (int t = 2; t < 2 + (QUAD && MB == 1 ? 4 : MB); t++) { cfg.rows[t] = 16; cfg.bpr[t] = uint16_t(cols * 4); }
    _tile_loadconfig(&cfg);
    alignas(64) uint16_t abuf[4][16 * 32];
    alignas(64) float c[16 * 16];
    if (QUAD && MB == 1) {
#pragma omp for schedule(static)
      for (int cq = 0; cq < w.N / 64; cq++) {
        _tile_zero(2); _tile_zero(3); _tile_zero(4); _tile_zero(5);
        alignas(64) float ring[2][4][32];
        if (AHEAD) for (int j = 0; j < 4; j++) scales_ahead(w.at(cq * 4 + j, 0), ring[0][j]);
        for (int g = 0; g < w.G; g++) {
          for (int j = 0; j < 4; j++) {
            const uint8_t* p = w.at(cq * 4 + j, g);
            for (int l = 0; l < 320; l += 64) _mm_prefetch((const char*)(p + 320 * PF + l), _MM_HINT_T1);
          }
          const uint16_t* xg = xt + size_t(g) * 512;
          float (*dm)[32] = ring[g & 1];
          if (AHEAD && g + 1 < w.G) for (int j = 0; j < 4; j++) scales_ahead(w.at(cq * 4 + j, g + 1), ring[(g + 1) & 1][j]);
          #define DQ(j) (AHEAD ? dequant3(w.at(cq * 4 + j, g), dm[j], abuf[j]) : dequant2(w.at(cq * 4 + j, g), abuf[j]))
          if (MODE != 2) { DQ(0); DQ(1); }
          _tile_loadd(1, xg, 64);
          _tile_loadd(0, abuf[0], 64); _tile_dpbf16ps(2, 0, 1);
          _tile_loadd(7, abuf[1], 64); _tile_dpbf16ps(3, 7, 1);
          if (MODE != 2) { DQ(2); DQ(3); }
          _tile_loadd(0, abuf[2], 64); _tile_dpbf16ps(4, 0, 1);
          _tile_loadd(7, abuf[3], 64); _tile_dpbf16ps(5, 7, 1);
        }
        for (int j = 0; j < 4; j++) {
          switch (j) { case 0: _tile_stored(2, c, cols * 4); break; case 1: _tile_stored(3, c, cols * 4); break;
                       case 2: _tile_stored(4, c, cols * 4); break; default: _tile_stored(5, c, cols * 4); }
          for (int n = 0; n < 16; n++)
            for (int mm = 0; mm < M; mm++) y[size_t(mm) * w.N + (cq * 4 + j) * 16 + n] = c[n * cols + mm];
        }
      }
      _tile_release();
    } else {
#pragma omp for schedule(static)
    for (int cb = 0; cb < w.N / 16; cb++) {
      _tile_zero(2); if (MB > 1) _tile_zero(3); if (MB > 2) _tile_zero(4); if (MB > 3) _tile_zero(5);
      if (PIPE && MODE != 2) dequant2(w.at(cb, 0), abuf[0]);
      for (int g = 0; g < w.G; g++) {
        const uint8_t* p = w.at(cb, g);
        for (int l = 0; l < 320; l += 64) _mm_prefetch((const char*)(p + 320 * PF + l), _MM_HINT_T1);
        uint16_t* a = abuf[g & 1];
        if (PIPE) { if (MODE != 2 && g + 1 < w.G) dequant2(w.at(cb, g + 1), abuf[(g + 1) & 1]); }
        else if (MODE != 2) { if (LAYOUT == 1) dequant2(p, a); else dequant(p, a); }
        if (MODE == 1) continue;
        const uint16_t* xg = xt + size_t(g) * MB * 512;
        if (!ALT || (g & 1) == 0) {
          _tile_loadd(0, a, 64);
          _tile_loadd(1, xg, 64); _tile_dpbf16ps(2, 0, 1);
          if (MB > 1) { _tile_loadd(6, xg + 512, 64); _tile_dpbf16ps(3, 0, 6); }
          if (MB > 2) { _tile_loadd(1, xg + 1024, 64); _tile_dpbf16ps(4, 0, 1); }
          if (MB > 3) { _tile_loadd(6, xg + 1536, 64); _tile_dpbf16ps(5, 0, 6); }
        } else {
          _tile_loadd(7, a, 64);
          _tile_loadd(1, xg, 64); _tile_dpbf16ps(2, 7, 1);
          if (MB > 1) { _tile_loadd(6, xg + 512, 64); _tile_dpbf16ps(3, 7, 6); }
          if (MB > 2) { _tile_loadd(1, xg + 1024, 64); _tile_dpbf16ps(4, 7, 1); }
          if (MB > 3) { _tile_loadd(6, xg + 1536, 64); _tile_dpbf16ps(5, 7, 6); }
        }
      }
      for (int mb = 0; mb < MB; mb++) {
        switch (mb) { case 0: _tile_stored(2, c, cols * 4); break; case 1: _tile_stored(3, c, 64); break;
                      case 2: _tile_stored(4, c, 64); break; default: _tile_stored(5, c, 64); }
        for (int n = 0; n < 16; n++)
          for (int mm = 0; mm < cols && mb * 16 + mm < M; mm++) y[size_t(mb * 16 + mm) * w.N + cb * 16 + n] = c[n * cols + mm];
      }
    }
    _tile_release();
    }
  }
}

int main(int argc, char** argv) {
  if (syscall(SYS_arch_prctl, 0x1023, 18)) { printf("no AMX\n"); return 1; }
  std::mt19937 g(3);
  int copies = argc > 1 ? atoi(argv[1]) : 12; MODE = argc > 2 ? atoi(argv[2]) : 0; LAYOUT = argc > 3 ? atoi(argv[3]) : 0; int pf = argc > 4 ? atoi(argv[4]) : 32; PF = pf; PIPE = argc > 5 ? atoi(argv[5]) : 0; ALT = argc > 6 ? atoi(argv[6]) : 0; QUAD = argc > 7 ? atoi(argv[7]) : 0; AHEAD = argc > 8 ? atoi(argv[8]) : 0;
  struct Shape { int K, N; const char* name; };
  for (Shape sh : {Shape{1536, 8960, "gate/up 1536->8960"}, Shape{8960, 1536, "down 8960->1536"}}) {
    int K = sh.K, N = sh.N; const char* name = sh.name;
    std::vector<float> dense;
    std::vector<Weight> ws;
    for (int i = 0; i < copies; i++) ws.push_back(make_weight(K, N, g, dense));  // dense: the last copy's
    std::normal_distribution<float> nd;
    std::vector<float> x(size_t(64) * K);
    for (auto& v : x) v = nd(g);
    std::vector<uint16_t> xt(size_t(K / 32) * 4 * 512);
    std::vector<float> y(size_t(64) * N), y1(N);
    // exactness: each row alone == the same row in passes of 2..64 rows
    long same = 0, total = 0;
    double max_rel = 0;
    for (int M : {1, 5, 16, 17, 33, 64}) {
      pack_x(x.data(), M, K, xt.data()); product(ws.back(), xt.data(), M, y.data());
      for (int m = 0; m < M; m += std::max(1, M / 4)) {
        std::vector<uint16_t> xt1(size_t(K / 32) * 512);
        pack_x(x.data() + size_t(m) * K, 1, K, xt1.data()); product(ws.back(), xt1.data(), 1, y1.data());
        same += !memcmp(y1.data(), y.data() + size_t(m) * N, N * 4); total++;
      }
    }
    { std::vector<uint16_t> xt1(size_t(K / 32) * 512); pack_x(x.data() + size_t(63) * K, 1, K, xt1.data()); product(ws.back(), xt1.data(), 1, y1.data()); }
    for (int n = 0; n < N; n += 97) {  // against a double reference over the same bf16 values
      double ref = 0, mag = 0;
      for (int k = 0; k < K; k++) { double t = double(fbf(bf(x[size_t(63) * K + k]))) * dense[size_t(k) * N + n]; ref += t; mag += std::fabs(t); }
      max_rel = std::max(max_rel, std::fabs(ref - y1[n]) / mag);
    }
    printf("%s: rows alone == rows in a pass: %ld of %ld; row 0 against a double sum: max rel %.2e\n", name, same, total, max_rel);
    for (int M : {1, 2, 4, 8, 16, 32, 64}) {
      pack_x(x.data(), M, K, xt.data());
      std::vector<double> times;
      for (int rep = 0; rep < 7; rep++) {
        auto t = std::chrono::steady_clock::now();
        for (auto& w : ws) product(w, xt.data(), M, y.data());
        times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count() / ws.size());
      }
      std::sort(times.begin(), times.end());
      double ms = times[3] * 1e3, gbs = double(K) * N * 5 / 8 / times[3] / 1e9;
      printf("  %2d rows: %.3f ms (%.1f GB/s of weights)\n", M, ms, gbs);
    }
  }
}
