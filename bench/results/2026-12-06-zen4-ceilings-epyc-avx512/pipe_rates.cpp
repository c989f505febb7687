#include <immintrin.h>
#include <chrono>
#include <cstdio>
#define R(i) __m512i a##i=_mm512_set1_epi32(i);
#define D(i) a##i=_mm512_dpbusd_epi32(a##i,b,c);
#define F(i) __m512 f##i=_mm512_set1_ps(i*0.001f);
#define M(i) f##i=_mm512_fmadd_ps(f##i,x,y);
int main(){
  R(0)R(1)R(2)R(3)R(4)R(5)R(6)R(7)R(8)R(9)R(10)R(11)
  F(0)F(1)F(2)F(3)F(4)F(5)F(6)F(7)F(8)F(9)F(10)F(11)
  __m512i b=_mm512_set1_epi8(3), c=_mm512_set1_epi8(5);
  __m512 x=_mm512_set1_ps(1.0000001f), y=_mm512_set1_ps(0.9999f);
  long N=1200000000;
  auto t0=std::chrono::steady_clock::now();
  for(long n=0;n<N/12;n++){ D(0)D(1)D(2)D(3)D(4)D(5)D(6)D(7)D(8)D(9)D(10)D(11) asm volatile(""::"v"(a0),"v"(a5)); }
  auto t1=std::chrono::steady_clock::now();
  for(long n=0;n<N/12;n++){ M(0)M(1)M(2)M(3)M(4)M(5)M(6)M(7)M(8)M(9)M(10)M(11) asm volatile(""::"v"(f0),"v"(f5)); }
  auto t2=std::chrono::steady_clock::now();
  for(long n=0;n<N/12;n++){ D(0)D(1)D(2)D(3)D(4)D(5)M(6)M(7)M(8)M(9)M(10)M(11) asm volatile(""::"v"(f6),"v"(a5)); }
  auto t3=std::chrono::steady_clock::now();
  double s1=std::chrono::duration<double>(t1-t0).count(), s2=std::chrono::duration<double>(t2-t1).count(), s3=std::chrono::duration<double>(t3-t2).count();
  printf("dpbusd zmm %.2f G/s, fma zmm %.2f G/s, half dpbusd half fma %.2f G/s\n", N/s1/1e9, N/s2/1e9, N/s3/1e9);
  __m512i s=_mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0,a1),_mm512_add_epi32(a2,a3)),_mm512_add_epi32(_mm512_add_epi32(a4,a5),_mm512_add_epi32(_mm512_add_epi32(a6,a7),_mm512_add_epi32(_mm512_add_epi32(a8,a9),_mm512_add_epi32(a10,a11)))));
  __m512 t=_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(f0,f1),_mm512_add_ps(f2,f3)),_mm512_add_ps(_mm512_add_ps(f4,f5),_mm512_add_ps(_mm512_add_ps(f6,f7),_mm512_add_ps(_mm512_add_ps(f8,f9),_mm512_add_ps(f10,f11)))));
  return _mm512_reduce_add_epi32(s)+(int)_mm512_reduce_add_ps(t)==42;
}
