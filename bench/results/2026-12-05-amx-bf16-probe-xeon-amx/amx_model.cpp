// What arithmetic does TDPBF16PS do? Its outputs against models of it (sequential float
// fmas in either order of a pair, exact pair sums added in turn, one exact sum, round toward
// zero, the pairs summed first and C added last), with 1, 2, 4 or 16 of the K pairs non-zero.
// g++ -O2 -o amx_model amx_model.cpp && ./amx_model
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <functional>
struct alignas(64) Cfg { uint8_t palette = 1, start = 0, res[14] = {}; uint16_t bpr[16] = {}; uint8_t rows[16] = {}; };
alignas(64) uint16_t A[16][32];
alignas(64) uint16_t B[16][32];
alignas(64) float C0[16][16], Ct[16][16];
static float f(uint16_t b) { uint32_t u = uint32_t(b) << 16; float x; memcpy(&x, &u, 4); return x; }
static float ftz(float x) { return std::fpclassify(x) == FP_SUBNORMAL ? std::copysign(0.0f, x) : x; }
static uint16_t bf(float x) { uint32_t u; memcpy(&u, &x, 4); u += 0x7fff + ((u >> 16) & 1); return uint16_t(u >> 16); }
__attribute__((target("amx-tile,amx-bf16"))) void tiles() {
  Cfg c; for (int t = 0; t < 3; t++) { c.rows[t] = 16; c.bpr[t] = 64; }
  _tile_loadconfig(&c); memcpy(Ct, C0, sizeof Ct);
  _tile_loadd(0, Ct, 64); _tile_loadd(1, A, 64); _tile_loadd(2, B, 64); _tile_dpbf16ps(0, 1, 2); _tile_stored(0, Ct, 64); _tile_release();
}
static float rz(double x) { // double -> float rounding toward zero
  std::fesetround(FE_TOWARDZERO); volatile float y = (float)x; std::fesetround(FE_TONEAREST); return y; }
int main() {
  syscall(SYS_arch_prctl, 0x1023, 18);
  std::mt19937 g(7); std::normal_distribution<float> n; std::uniform_int_distribution<int> e(-6, 6);
  for (int active : {1, 2, 4, 16}) {
    const int NM = 8; const char* names[NM] = {"seq even-odd RNE", "seq odd-even RNE", "pair exact then add, RNE each k", "all exact, one RNE",
      "pair exact RZ each k", "seq even-odd RZ", "all exact RZ", "pair exact, k-sum float, add C last"};
    long hit[NM] = {}, total = 0;
    for (int trial = 0; trial < 3000; trial++) {
      for (int m = 0; m < 16; m++) for (int k = 0; k < 32; k++) A[m][k] = k < 2 * active ? bf(std::ldexp(n(g), e(g))) : 0;
      for (int k = 0; k < 16; k++) for (int j = 0; j < 32; j++) B[k][j] = k < active ? bf(std::ldexp(n(g), e(g))) : 0;
      for (int m = 0; m < 16; m++) for (int j = 0; j < 16; j++) C0[m][j] = std::ldexp(n(g), e(g));
      tiles();
      for (int m = 0; m < 16; m++) for (int j = 0; j < 16; j++) {
        float c = C0[m][j]; float r[NM];
        float s0 = c, s1 = c, s2 = c, s4 = c, s5 = c, ks = 0; double all = c;
        for (int k = 0; k < active; k++) {
          float a0 = f(A[m][2*k]), a1 = f(A[m][2*k+1]), b0 = f(B[k][2*j]), b1 = f(B[k][2*j+1]);
          s0 = ftz(ftz(s0 + a0*b0) + a1*b1);
          s1 = ftz(ftz(s1 + a1*b1) + a0*b0);
          s2 = ftz(float(double(s2) + double(a0*b0) + double(a1*b1)));  // exact: products exact in double, sum of 3 may round once... approx
          all += double(a0*b0) + double(a1*b1);
          s4 = rz(double(s4) + double(a0*b0) + double(a1*b1));
          s5 = rz(double(rz(double(s5) + double(a0*b0))) + double(a1*b1));
          ks = ks + float(double(a0*b0) + double(a1*b1));
        }
        r[0]=s0; r[1]=s1; r[2]=s2; r[3]=ftz(float(all)); r[4]=s4; r[5]=s5; r[6]=rz(all); r[7]=c+ks;
        for (int i = 0; i < NM; i++) hit[i] += !memcmp(&r[i], &Ct[m][j], 4);
        total++;
      }
    }
    printf("pairs active %d (%ld outputs):", active, total);
    for (int i = 0; i < NM; i++) printf(" [%s] %.4f", names[i], double(hit[i]) / total);
    printf("\n");
  }
}
