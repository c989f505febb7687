// Does an AMX-BF16 tile product (TDPBF16PS) give the same float bits, row by row, as the
// AVX-512 BF16 dot product (VDPBF16PS) run over the same pairs in the same order, and as a
// scalar model? If so, a pass of many rows on tiles equals its one-row steps on vectors.
// g++ -O2 -o bf16_match bf16_match.cpp && ./bf16_match
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>

struct alignas(64) Cfg { uint8_t palette = 1, start = 0, res[14] = {}; uint16_t bpr[16] = {}; uint8_t rows[16] = {}; };
alignas(64) uint16_t A[16][32];      // M x K bf16
alignas(64) uint16_t B[16][32];      // K/2 rows x (16 columns x 2) bf16, pairs per column
alignas(64) float C0[16][16], Ct[16][16], Cv[16][16], Cs[16][16], Cs2[16][16], Cs3[16][16], Cv2[16][16];

static float f(uint16_t b) { uint32_t u = uint32_t(b) << 16; float x; memcpy(&x, &u, 4); return x; }
static float ftz(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }
static uint16_t bf(float x) { uint32_t u; memcpy(&u, &x, 4); u += 0x7fff + ((u >> 16) & 1); return uint16_t(u >> 16); }

__attribute__((target("amx-tile,amx-bf16"))) void tiles(int m_rows) {
  Cfg c; c.rows[0] = m_rows; c.bpr[0] = 64; c.rows[1] = m_rows; c.bpr[1] = 64; c.rows[2] = 16; c.bpr[2] = 64;
  _tile_loadconfig(&c);
  memcpy(Ct, C0, sizeof Ct);
  _tile_loadd(0, Ct, 64); _tile_loadd(1, A, 64); _tile_loadd(2, B, 64);
  _tile_dpbf16ps(0, 1, 2);
  _tile_stored(0, Ct, 64);
  _tile_release();
}
__attribute__((target("avx512f,avx512bf16"))) void vectors(bool swap) {
  for (int m = 0; m < 16; m++) {
    __m512 acc = _mm512_loadu_ps(C0[m]);
    for (int k = 0; k < 16; k++) {
      uint32_t pair = uint32_t(A[m][2 * k]) | uint32_t(A[m][2 * k + 1]) << 16;
      __m512i b = _mm512_loadu_si512(B[k]);
      if (swap) { pair = pair >> 16 | pair << 16; b = _mm512_or_si512(_mm512_srli_epi32(b, 16), _mm512_slli_epi32(b, 16)); }
      acc = _mm512_dpbf16_ps(acc, (__m512bh)b, (__m512bh)_mm512_set1_epi32(int(pair)));
    }
    _mm512_storeu_ps(swap ? Cv2[m] : Cv[m], acc);
  }
}
int main() {
  long r = syscall(SYS_arch_prctl, 0x1023, 18);
  if (r) { printf("no AMX permission\n"); return 1; }
  std::mt19937 g(1);
  std::normal_distribution<float> n;
  std::uniform_int_distribution<int> e(-24, 24);
  long same_tv = 0, same_tv2 = 0, same_even = 0, same_odd = 0, same_pair = 0, same_m1 = 0, total = 0;
  for (int trial = 0; trial < 2000; trial++) {
    for (int m = 0; m < 16; m++) for (int k = 0; k < 32; k++) A[m][k] = bf(std::ldexp(n(g), e(g) / 3));
    for (int k = 0; k < 16; k++) for (int j = 0; j < 32; j++) B[k][j] = bf(std::ldexp(n(g), e(g) / 3));
    for (int m = 0; m < 16; m++) for (int j = 0; j < 16; j++) C0[m][j] = trial % 2 ? std::ldexp(n(g), e(g)) : 0.0f;
    tiles(16);
    float T16[16][16]; memcpy(T16, Ct, sizeof T16);
    tiles(1);
    vectors(false); vectors(true);
    for (int m = 0; m < 16; m++) for (int j = 0; j < 16; j++) {
      float even = C0[m][j], odd = C0[m][j], pair = C0[m][j];
      for (int k = 0; k < 16; k++) {
        float a0 = f(A[m][2 * k]), a1 = f(A[m][2 * k + 1]), b0 = f(B[k][2 * j]), b1 = f(B[k][2 * j + 1]);
        even = ftz(ftz(even + a0 * b0) + a1 * b1);
        odd = ftz(ftz(odd + a1 * b1) + a0 * b0);
        pair = ftz(float(double(pair) + double(a0 * b0) + double(a1 * b1)));
      }
      Cs[m][j] = even; Cs2[m][j] = odd; Cs3[m][j] = pair;
      total++;
      same_tv += !memcmp(&T16[m][j], &Cv[m][j], 4);
      same_tv2 += !memcmp(&T16[m][j], &Cv2[m][j], 4);
      same_even += !memcmp(&T16[m][j], &even, 4);
      same_odd += !memcmp(&Cv[m][j], &odd, 4);
      same_pair += !memcmp(&T16[m][j], &pair, 4);
      if (m == 0) same_m1 += !memcmp(&T16[0][j], &Ct[0][j], 4);
    }
  }
  printf("%ld outputs: tile == vector %ld, tile == vector with pairs swapped %ld, tile == scalar even-then-odd %ld, "
         "vector == scalar odd-then-even %ld, tile == scalar pair-exact %ld; tile 16 rows == tile 1 row (row 0) %ld of %ld\n",
         total, same_tv, same_tv2, same_even, same_odd, same_pair, same_m1, total / 16);
}
