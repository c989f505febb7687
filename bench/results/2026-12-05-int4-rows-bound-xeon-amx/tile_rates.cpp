// AMX-INT8 tile instructions in the int4 kernel's patterns, in cycles at an assumed 3.3 GHz (the
// time a pattern takes divided by its repeats). Needs a CPU with amx_int8 and Linux 5.16+.
// g++ -O2 -o tile_rates tile_rates.cpp && ./tile_rates
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <chrono>
#include <cstdio>
#include <cstdint>
#include <cstring>
using clk = std::chrono::steady_clock;
struct alignas(64) Cfg { uint8_t palette=1, start=0, res[14]={}; uint16_t bpr[16]={}; uint8_t rows[16]={}; };
alignas(64) int8_t A[64][16*64];
alignas(64) uint8_t B[64][16*64];
alignas(64) int32_t C[64][16*16];
constexpr long N = 2000000;
Cfg c;
__attribute__((target("amx-tile,amx-int8"))) void cfg(int krows) {
  memset(&c, 0, sizeof c); c.palette = 1; for (int t=0;t<4;t++){c.rows[t]=16;c.bpr[t]=64;} for(int t=4;t<6;t++){c.rows[t]=16;c.bpr[t]=krows*4;} for(int t=6;t<8;t++){c.rows[t]=krows;c.bpr[t]=64;}
  _tile_loadconfig(&c);
}
#define T0 auto t=clk::now(); cfg(krows);
const char* names[32]; double vals[32]; int nres=0;
#define T1(name, per) { double s=std::chrono::duration<double>(clk::now()-t).count(); names[nres]=name; vals[nres++]=s/N*3.3e9/per; }
__attribute__((target("amx-tile,amx-int8"))) void run(int krows) {
  cfg(krows);
  { T0 for (long i=0;i<N;i++){ _tile_dpbssd(0,4,6); _tile_dpbssd(1,5,7); _tile_dpbssd(2,4,6); _tile_dpbssd(3,5,7);} T1("dp only (4 C tiles)", 4) }
  { T0 for (long i=0;i<N;i++){ _tile_loadd(4, A[i&63], krows*4); _tile_loadd(6, B[i&63], 64); _tile_dpbssd(0,4,6); _tile_loadd(5, A[(i+1)&63], krows*4); _tile_loadd(7, B[(i+1)&63], 64); _tile_dpbssd(1,5,7);} T1("load A,B + dp", 2) }
  { T0 for (long i=0;i<N;i++){ _tile_stored(0, C[i&63], 64); _tile_stored(1, C[(i+1)&63], 64);} T1("store C only", 2) }
  { T0 for (long i=0;i<N;i++){ _tile_loadd(4, A[i&63], 32); } T1("load A (16x32B, stride 32)", 1) }
  { T0 for (long i=0;i<N;i++){ _tile_loadd(4, A[0]+ (i&7)*32, 1536); } T1("load A (16x32B, stride 1536)", 1) }
  { T0 for (long i=0;i<N;i++){ _tile_loadd(6, B[i&63], 64); } T1("load B", 1) }
  { T0 for (long i=0;i<N;i++){
      #define G(c,a,b,j) _tile_zero(c); _tile_loadd(a, A[(i*4+j)&63], krows*4); _tile_loadd(b, B[(i*4+j)&63], 64); _tile_dpbssd(c,a,b); _tile_stored(c, C[(i*4+j)&63], 64);
      G(0,4,6,0) G(1,5,7,1) G(2,4,6,2) G(3,5,7,3) } T1("kernel pattern zero/ld/ld/dp/st", 4) }
  { T0 for (long i=0;i<N;i++){
      _tile_zero(0);_tile_zero(1);_tile_zero(2);_tile_zero(3);
      _tile_loadd(4, A[(i*4)&63], krows*4); _tile_loadd(6, B[(i*4)&63], 64); _tile_dpbssd(0,4,6);
      _tile_loadd(5, A[(i*4+1)&63], krows*4); _tile_loadd(7, B[(i*4+1)&63], 64); _tile_dpbssd(1,5,7);
      _tile_loadd(4, A[(i*4+2)&63], krows*4); _tile_loadd(6, B[(i*4+2)&63], 64); _tile_dpbssd(2,4,6);
      _tile_loadd(5, A[(i*4+3)&63], krows*4); _tile_loadd(7, B[(i*4+3)&63], 64); _tile_dpbssd(3,5,7);
      _tile_stored(0, C[(i*4)&63], 64); _tile_stored(1, C[(i*4+1)&63], 64); _tile_stored(2, C[(i*4+2)&63], 64); _tile_stored(3, C[(i*4+3)&63], 64);
    } T1("grouped: 4 dp then 4 stores", 4) }

  { T0 for (long i=0;i<N;i++){
      #define H(c,a,b,j) _tile_loadd(a, A[(i*4+j)&63], krows*4); _tile_loadd(b, B[(i*4+j)&63], 64); _tile_dpbssd(c,a,b); _tile_stored(c, C[(i*4+j)&63], 64);
      H(0,4,6,0) H(1,5,7,1) H(2,4,6,2) H(3,5,7,3) } T1("no zero: ld/ld/dp/st", 4) }
  { T0 for (long i=0;i<N;i++){
      #define Z(c,a,b,j) _tile_zero(c); _tile_dpbssd(c,a,b); _tile_stored(c, C[(i*4+j)&63], 64);
      Z(0,4,6,0) Z(1,5,7,1) Z(2,4,6,2) Z(3,5,7,3) } T1("no loads: zero/dp/st", 4) }
  { T0 for (long i=0;i<N;i++){
      #define L(c,a,b,j) _tile_zero(c); _tile_loadd(a, A[(i*4+j)&63], krows*4); _tile_loadd(b, B[(i*4+j)&63], 64); _tile_dpbssd(c,a,b);
      L(0,4,6,0) L(1,5,7,1) L(2,4,6,2) L(3,5,7,3) } T1("no store: zero/ld/ld/dp", 4) }
  { T0 for (long i=0;i<N;i++){
      _tile_loadd(6, B[(i*2)&63], 64); _tile_loadd(7, B[(i*2+1)&63], 64);
      _tile_loadd(4, A[(i*4)&63], krows*4); _tile_dpbssd(0,4,6);
      _tile_loadd(5, A[(i*4+1)&63], krows*4); _tile_dpbssd(1,5,6);
      _tile_loadd(4, A[(i*4+2)&63], krows*4); _tile_dpbssd(2,4,7);
      _tile_loadd(5, A[(i*4+3)&63], krows*4); _tile_dpbssd(3,5,7);
      _tile_stored(0, C[(i*4)&63], 64); _tile_stored(1, C[(i*4+1)&63], 64); _tile_stored(2, C[(i*4+2)&63], 64); _tile_stored(3, C[(i*4+3)&63], 64);
      _tile_zero(0);_tile_zero(1);_tile_zero(2);_tile_zero(3);
    } T1("B shared by 2 row pieces", 4) }
  { T0 for (long i=0;i<N;i++){ _tile_zero(0); _tile_zero(1); } T1("zero only", 2) }
  { T0 for (long i=0;i<N;i++){
      _tile_zero(0); _tile_loadd(4, A[(i*4)&63], krows*4); _tile_loadd(6, B[(i*4)&63], 64); _tile_dpbssd(0,4,6);
      _tile_zero(1); _tile_loadd(5, A[(i*4+1)&63], krows*4); _tile_loadd(7, B[(i*4+1)&63], 64); _tile_dpbssd(1,5,7);
      _tile_stored(2, C[(i*4+2)&63], 64); _tile_stored(3, C[(i*4+3)&63], 64);
      _tile_zero(2); _tile_loadd(4, A[(i*4+2)&63], krows*4); _tile_loadd(6, B[(i*4+2)&63], 64); _tile_dpbssd(2,4,6);
      _tile_zero(3); _tile_loadd(5, A[(i*4+3)&63], krows*4); _tile_loadd(7, B[(i*4+3)&63], 64); _tile_dpbssd(3,5,7);
      _tile_stored(0, C[(i*4)&63], 64); _tile_stored(1, C[(i*4+1)&63], 64);
    } T1("stores one half-round behind", 4) }
  { T0 for (long i=0;i<N;i++){
      _tile_zero(0); _tile_loadd(4, A[(i*4)&63], krows*4); _tile_loadd(6, B[(i*4)&63], 64); _tile_dpbssd(0,4,6);
      _tile_stored(1, C[(i*4+1)&63], 64);
      _tile_zero(1); _tile_loadd(5, A[(i*4+1)&63], krows*4); _tile_loadd(7, B[(i*4+1)&63], 64); _tile_dpbssd(1,5,7);
      _tile_stored(2, C[(i*4+2)&63], 64);
      _tile_zero(2); _tile_loadd(4, A[(i*4+2)&63], krows*4); _tile_loadd(6, B[(i*4+2)&63], 64); _tile_dpbssd(2,4,6);
      _tile_stored(3, C[(i*4+3)&63], 64);
      _tile_zero(3); _tile_loadd(5, A[(i*4+3)&63], krows*4); _tile_loadd(7, B[(i*4+3)&63], 64); _tile_dpbssd(3,5,7);
      _tile_stored(0, C[(i*4)&63], 64);
    } T1("each store 3 groups behind its dp", 4) }
  { T0 for (long i=0;i<N;i++){ _tile_dpbssd(0,4,6); _tile_stored(1, C[(i*4+1)&63], 64); _tile_dpbssd(1,5,7); _tile_stored(2, C[(i*4+2)&63], 64); _tile_dpbssd(2,4,6); _tile_stored(3, C[(i*4+3)&63], 64); _tile_dpbssd(3,5,7); _tile_stored(0, C[(i*4)&63], 64);} T1("dp + store of an older tile", 4) }
  _tile_release();
}
int main(){ long r=syscall(SYS_arch_prctl, 0x1023, 18); fprintf(stderr, "perm %ld\n", r); memset(A,1,sizeof A); memset(B,1,sizeof B); run(8); run(16); for(int i=0;i<nres;i++) printf("%s K=%d: %.1f cycles @3.3GHz\n", names[i], i<nres/2?32:64, vals[i]); }
