#include <immintrin.h>
#include <chrono>
#include <cstdio>
#define R(i) __m512i a##i=_mm512_set1_epi32(i);
#define D(i) a##i=_mm512_dpbusd_epi32(a##i,b,c);
#define F(i) __m512 f##i=_mm512_set1_ps(i*0.001f);
#define CV(i) f##i=_mm512_cvtepi32_ps(a##i); asm volatile("":"+v"(f##i));
#define AN(i) a##i=_mm512_and_si512(a##i,b);
#define SH(i) a##i=_mm512_srli_epi16(a##i,1);
template<class T> double tm(T f){auto t0=std::chrono::steady_clock::now(); f(); return std::chrono::duration<double>(std::chrono::steady_clock::now()-t0).count();}
int main(){
  R(0)R(1)R(2)R(3)R(4)R(5)R(6)R(7)R(8)R(9)R(10)R(11)
  F(0)F(1)F(2)F(3)F(4)F(5)F(6)F(7)F(8)F(9)F(10)F(11)
  __m512i b=_mm512_set1_epi8(3), c=_mm512_set1_epi8(5);
  long N=600000000;
  double s0=tm([&]{for(long n=0;n<N/8;n++){ D(0)D(1)D(2)D(3)D(4)D(5)D(6)D(7) asm volatile(""::"v"(a0),"v"(a5)); }});
  double s1=tm([&]{for(long n=0;n<N/8;n++){ D(0)D(1)D(2)D(3)D(4)D(5)D(6)D(7) CV(8)CV(9)CV(10)CV(11) asm volatile(""::"v"(a0),"v"(a5)); }});
  double s2=tm([&]{for(long n=0;n<N/8;n++){ D(0)D(1)D(2)D(3)D(4)D(5)D(6)D(7) AN(8)AN(9)AN(10)AN(11) asm volatile(""::"v"(a0),"v"(a5)); }});
  double s3=tm([&]{for(long n=0;n<N/8;n++){ D(0)D(1)D(2)D(3)D(4)D(5)D(6)D(7) SH(8)SH(9)SH(10)SH(11) asm volatile(""::"v"(a0),"v"(a5)); }});
  printf("8 dpbusd alone: %.2f ns/iter; +4 cvt %.2f; +4 and %.2f; +4 srlw %.2f\n", s0/(N/8)*1e9, s1/(N/8)*1e9, s2/(N/8)*1e9, s3/(N/8)*1e9);
  __m512i s=_mm512_add_epi32(_mm512_add_epi32(_mm512_add_epi32(a0,a1),_mm512_add_epi32(a2,a3)),_mm512_add_epi32(_mm512_add_epi32(a4,a5),_mm512_add_epi32(_mm512_add_epi32(a6,a7),_mm512_add_epi32(_mm512_add_epi32(a8,a9),_mm512_add_epi32(a10,a11)))));
  __m512 t=_mm512_add_ps(_mm512_add_ps(_mm512_add_ps(f0,f1),_mm512_add_ps(f2,f3)),_mm512_add_ps(_mm512_add_ps(f4,f5),_mm512_add_ps(_mm512_add_ps(f6,f7),_mm512_add_ps(_mm512_add_ps(f8,f9),_mm512_add_ps(f10,f11)))));
  return _mm512_reduce_add_epi32(s)+(int)_mm512_reduce_add_ps(t)==42;
}
