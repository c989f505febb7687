#define main probe_main
#include "amx_bf16_probe.cpp"
#undef main
// variants of dequant2 to find what costs
template <int V>
__attribute__((always_inline)) inline void dq(const uint8_t* p, uint16_t* a, __m512i fixed_table, const float* pre) {
  const __m512 qs = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  alignas(64) float dmb[32];
  const float* dm = dmb;
  if (V == 3) dm = pre;
  else {
  _mm512_store_ps(dmb, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(p + 256))));
  _mm512_store_ps(dmb + 16, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(p + 288))));
  }
  const __m512i lo_mask = _mm512_set1_epi16(0x0f), high_half = _mm512_set1_epi16(0x10);
#pragma GCC unroll 8
  for (int pr = 0; pr < 8; pr++) {
    int c = 2 * pr;
    __m512i table;
    if (V == 1) table = _mm512_add_epi16(fixed_table, _mm512_set1_epi16(pr));  // no table math
    else {
      __m512 even = _mm512_fmsub_ps(qs, _mm512_set1_ps(dm[c]), _mm512_set1_ps(dm[16 + c]));
      __m512 odd = _mm512_fmsub_ps(qs, _mm512_set1_ps(dm[c + 1]), _mm512_set1_ps(dm[17 + c]));
      table = (__m512i)_mm512_cvtne2ps_pbh(even, odd);
    }
    __m512i w = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(p + pr * 32)));
    __m512i ie = _mm512_ternarylogic_epi32(w, lo_mask, high_half, 0xEA);
    __m512i io = _mm512_srli_epi16(w, 4);
    if (V == 2) {  // no lookups: store indices
      _mm512_store_si512((__m512i*)(a + c * 32), _mm512_xor_si512(ie, table));
      _mm512_store_si512((__m512i*)(a + (c + 1) * 32), _mm512_xor_si512(io, table));
    } else {
      _mm512_store_si512((__m512i*)(a + c * 32), _mm512_permutexvar_epi16(ie, table));
      _mm512_store_si512((__m512i*)(a + (c + 1) * 32), _mm512_permutexvar_epi16(io, table));
    }
  }
}
template <int V> double run(const std::vector<uint8_t>& blob, long N) {
  std::vector<float> pres(64 * 32, 0.01f);
  alignas(64) uint16_t a[512];
  __m512i ft = _mm512_set1_epi16(3);
  auto t = std::chrono::steady_clock::now();
  for (long i = 0; i < N; i++) { dq<V>(blob.data() + (i & 63) * 320, a, ft, pres.data() + (i & 63) * 32); asm volatile("" : : "r"(a) : "memory"); }
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count() / N * 1e9;
}
int main() {
  std::vector<uint8_t> blob(320 * 64);
  for (auto& b : blob) b = rand();
  for (int i = 0; i < 64; i++) { uint16_t* dmv = (uint16_t*)(blob.data() + i * 320 + 256); for (int c = 0; c < 32; c++) dmv[c] = _cvtss_sh(0.01f, 0); }
  long N = 2000000;
  for (int r = 0; r < 2; r++)
    printf("ns a block: full %.1f, fixed table %.1f, no lookup %.1f, scales converted ahead %.1f\n", run<0>(blob, N), run<1>(blob, N), run<2>(blob, N), run<3>(blob, N));
}
