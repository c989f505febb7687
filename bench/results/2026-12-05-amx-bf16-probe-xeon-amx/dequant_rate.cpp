// The probe's two dequantizations from L1 (64 blocks in turn, one core): ns per block of 512
// weights. g++ -O2 -fopenmp -mavx512f -mavx512bw -mavx512vl -mavx512dq -mavx512bf16 \
//   -mamx-tile -mamx-bf16 -mf16c -mfma -o dequant_rate dequant_rate.cpp && ./dequant_rate
#define main probe_main
#include "amx_bf16_probe.cpp"
#undef main
int main() {
  std::vector<uint8_t> blob(320 * 64);
  for (auto& b : blob) b = rand();
  for (int i = 0; i < 64; i++) { uint16_t* dm = (uint16_t*)(blob.data() + i * 320 + 256); for (int c = 0; c < 32; c++) dm[c] = _cvtss_sh(0.01f, 0); }
  alignas(64) uint16_t a[512];
  long N = 2000000;
  auto t = std::chrono::steady_clock::now();
  for (long i = 0; i < N; i++) { dequant(blob.data() + (i & 63) * 320, a); asm volatile("" ::: "memory"); }
  double s0 = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  printf("dequant (layout 0) from L1: %.1f ns per 512 weights\n", s0 / N * 1e9);
  t = std::chrono::steady_clock::now();
  for (long i = 0; i < N; i++) { dequant2(blob.data() + (i & 63) * 320, a); asm volatile("" ::: "memory"); }
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  printf("dequant2 (layout 1) from L1: %.1f ns per 512 weights\n", s / N * 1e9);
}
