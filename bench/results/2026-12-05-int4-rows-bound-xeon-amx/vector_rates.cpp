// The vector instructions of the int4 kernel, each alone in 12 independent register chains:
// billions a second on one core. g++ -O3 -o vector_rates vector_rates.cpp && ./vector_rates
#include <immintrin.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
using clk = std::chrono::steady_clock;
#define N 200000000LL
__attribute__((target("avx512f,avx512vnni"))) double dp() {
  __m512i a[12]; for (int i=0;i<12;i++) a[i]=_mm512_set1_epi32(i);
  __m512i b=_mm512_set1_epi32(3), c=_mm512_set1_epi32(5);
  auto t=clk::now();
  for (long long i=0;i<N/12;i++){ _Pragma("GCC unroll 16") for(int j=0;j<12;j++){ a[j]=_mm512_dpbusd_epi32(a[j],b,c); asm(""::"v"(a[j]));} }
  double s=std::chrono::duration<double>(clk::now()-t).count();
  int x=0; for(int i=0;i<12;i++) x+=_mm512_reduce_add_epi32(a[i]); if(x==1) printf("");
  return N/s/1e9;
}
__attribute__((target("avx512f"))) double fma512() {
  __m512 a[12]; for (int i=0;i<12;i++) a[i]=_mm512_set1_ps(i);
  __m512 b=_mm512_set1_ps(0.999f), c=_mm512_set1_ps(0.001f);
  auto t=clk::now();
  for (long long i=0;i<N/12;i++){ _Pragma("GCC unroll 16") for(int j=0;j<12;j++){ a[j]=_mm512_fmadd_ps(a[j],b,c); asm(""::"v"(a[j]));} }
  double s=std::chrono::duration<double>(clk::now()-t).count();
  float x=0; for(int i=0;i<12;i++) x+=_mm512_reduce_add_ps(a[i]); if(x==1) printf("");
  return N/s/1e9;
}
__attribute__((target("avx2,fma"))) double fma256() {
  __m256 a[12]; for (int i=0;i<12;i++) a[i]=_mm256_set1_ps(i);
  __m256 b=_mm256_set1_ps(0.999f), c=_mm256_set1_ps(0.001f);
  auto t=clk::now();
  for (long long i=0;i<N/12;i++){ _Pragma("GCC unroll 16") for(int j=0;j<12;j++){ a[j]=_mm256_fmadd_ps(a[j],b,c); asm(""::"x"(a[j]));} }
  double s=std::chrono::duration<double>(clk::now()-t).count();
  return N/s/1e9;
}
__attribute__((target("avx512f"))) double cvt512() {
  __m512i a[12]; for (int i=0;i<12;i++) a[i]=_mm512_set1_epi32(i);
  __m512 o[12];
  auto t=clk::now();
  for (long long i=0;i<N/12;i++){ _Pragma("GCC unroll 16") for(int j=0;j<12;j++){ a[j]=_mm512_castps_si512(_mm512_cvtepi32_ps(a[j])); asm(""::"v"(a[j]));} }
  double s=std::chrono::duration<double>(clk::now()-t).count();
  return N/s/1e9;
}
// mixed: 8 dpbusd + 2 fma ratio
__attribute__((target("avx512f,avx512vnni"))) double mix() {
  __m512i a[8]; for (int i=0;i<8;i++) a[i]=_mm512_set1_epi32(i);
  __m512 f[4]; for (int i=0;i<4;i++) f[i]=_mm512_set1_ps(i);
  __m512i b=_mm512_set1_epi32(3), c=_mm512_set1_epi32(5);
  __m512 fb=_mm512_set1_ps(0.999f), fc=_mm512_set1_ps(0.001f);
  auto t=clk::now();
  for (long long i=0;i<N/12;i++){ _Pragma("GCC unroll 16") for(int j=0;j<8;j++){ a[j]=_mm512_dpbusd_epi32(a[j],b,c); asm(""::"v"(a[j]));}
     _Pragma("GCC unroll 16") for(int j=0;j<4;j++){ f[j]=_mm512_fmadd_ps(f[j],fb,fc); asm(""::"v"(f[j]));} }
  double s=std::chrono::duration<double>(clk::now()-t).count();
  return N/s/1e9;
}
int main(){ for(int r=0;r<2;r++) printf("dpbusd512 %.2f G/s  fma512 %.2f  fma256 %.2f  cvt512 %.2f  mix(8dp+4fma) %.2f Gops/s\n", dp(), fma512(), fma256(), cvt512(), mix()); }
