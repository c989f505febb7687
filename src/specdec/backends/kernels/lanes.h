// What the int4 kernel's sources share: 8-lane vectors in GCC's vector extensions (IEEE
// operations lane by lane, so the same bits whatever instructions a clone compiles them to)
// and the clones of the functions that use them, one chosen per CPU at load time.
#pragma once

#include <cstdint>

// SPECDEC_BASELINE_ONLY: x86-64 baseline code only (a test builds it to check the clones agree;
// SPECDEC_INT4_PATH=scalar loads it). SPECDEC_UP_TO_AVX2: no AVX-512 clone, so that a CPU with
// AVX-512 runs the AVX2 code (SPECDEC_INT4_PATH=avx2 loads it, to measure an AVX2 CPU there).
#if defined(SPECDEC_BASELINE_ONLY)
#define SPECDEC_CLONES
#elif defined(SPECDEC_UP_TO_AVX2)
#define SPECDEC_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define SPECDEC_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#endif

typedef float F8 __attribute__((vector_size(32)));
typedef int32_t I8 __attribute__((vector_size(32)));
