// TDPBF16PS with two pairs non-zero: its outputs against more models, and the first
// mismatches printed (argument 1: pairs non-zero; argument 2: 1 to start from C = 0).
// g++ -O2 -o amx_model2 amx_model2.cpp && ./amx_model2 2 0 && ./amx_model2 2 1
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <cfenv>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
struct alignas(64) Cfg { uint8_t palette = 1, start = 0, res[14] = {}; uint16_t bpr[16] = {}; uint8_t rows[16] = {}; };
alignas(64) uint16_t A[16][32];
alignas(64) uint16_t B[16][32];
alignas(64) float C0[16][16], Ct[16][16];
static float f(uint16_t b) { uint32_t u = uint32_t(b) << 16; float x; memcpy(&x, &u, 4); return x; }
static uint16_t bf(float x) { uint32_t u; memcpy(&u, &x, 4); u += 0x7fff + ((u >> 16) & 1); return uint16_t(u >> 16); }
static float rmode(double x, int mode) { std::fesetround(mode); volatile float y = (float)x; std::fesetround(FE_TONEAREST); return y; }
__attribute__((target("amx-tile,amx-bf16"))) void tiles() {
  Cfg c; for (int t = 0; t < 3; t++) { c.rows[t] = 16; c.bpr[t] = 64; }
  _tile_loadconfig(&c); memcpy(Ct, C0, sizeof Ct);
  _tile_loadd(0, Ct, 64); _tile_loadd(1, A, 64); _tile_loadd(2, B, 64); _tile_dpbf16ps(0, 1, 2); _tile_stored(0, Ct, 64); _tile_release();
}
int main(int argc, char** argv) {
  syscall(SYS_arch_prctl, 0x1023, 18);
  int active = argc > 1 ? atoi(argv[1]) : 2; int zeroc = argc > 2 ? atoi(argv[2]) : 0;
  std::mt19937 g(7); std::normal_distribution<float> n; std::uniform_int_distribution<int> e(-6, 6);
  const int NM = 6; const char* names[NM] = {"fl(fl(p0)+fl(p1))", "fl(exact all)", "RZ pairs, RNE sum", "RZ pair, RZ sum", "RNE pair, RZ sum", "fl(p1)+fl(p0) rev"};
  long hit[NM] = {}, total = 0; int shown = 0;
  for (int trial = 0; trial < 3000; trial++) {
    for (int m = 0; m < 16; m++) for (int k = 0; k < 32; k++) A[m][k] = k < 2 * active ? bf(std::ldexp(n(g), e(g))) : 0;
    for (int k = 0; k < 16; k++) for (int j = 0; j < 32; j++) B[k][j] = k < active ? bf(std::ldexp(n(g), e(g))) : 0;
    for (int m = 0; m < 16; m++) for (int j = 0; j < 16; j++) C0[m][j] = zeroc ? 0.0f : std::ldexp(n(g), e(g));
    tiles();
    for (int m = 0; m < 16; m++) for (int j = 0; j < 16; j++) {
      double p[16]; double all = 0;
      for (int k = 0; k < active; k++) { p[k] = double(f(A[m][2*k]) * f(B[k][2*j])) + double(f(A[m][2*k+1]) * f(B[k][2*j+1])); all += p[k]; }
      float c = C0[m][j]; float r[NM];
      float s = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0;
      for (int k = 0; k < active; k++) { s += (float)p[k]; s2 = rmode(double(s2) + double(rmode(p[k], FE_TOWARDZERO)), FE_TONEAREST);
        s3 = rmode(double(s3) + double(rmode(p[k], FE_TOWARDZERO)), FE_TOWARDZERO); s4 = rmode(double(s4) + double((float)p[k]), FE_TOWARDZERO); }
      for (int k = active - 1; k >= 0; k--) s5 += (float)p[k];
      r[0] = c + s; r[1] = c + (float)all; r[2] = c + s2; r[3] = c + s3; r[4] = c + s4; r[5] = c + s5;
      for (int i = 0; i < NM; i++) hit[i] += !memcmp(&r[i], &Ct[m][j], 4);
      if (memcmp(&r[0], &Ct[m][j], 4) && shown < 6) { shown++; uint32_t a, b; memcpy(&a, &Ct[m][j], 4); memcpy(&b, &r[0], 4);
        printf("tile %.9g (%08x) model %.9g (%08x) c %.9g p0 %.17g p1 %.17g fl(p0+p1) %.9g exact %.17g\n", Ct[m][j], a, r[0], b, c, p[0], p[1], (float)(p[0]+p[1]), c + all); }
      total++;
    }
  }
  for (int i = 0; i < NM; i++) printf("[%s] %.4f ", names[i], double(hit[i]) / total);
  printf("\n");
}
