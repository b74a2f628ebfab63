#pragma once
// Include this instead of <immintrin.h> in files with target-attributed SIMD kernels.
//
// GCC 12's AVX-512 intrinsics initialise their pass-through operand with a self-assignment
// (`__m512i __Y = __Y;`), which -Wmaybe-uninitialized reports at every inlined call site in our code
// (GCC bug 105593, fixed in GCC 13). The warning is a false positive, so it is silenced for the rest
// of any translation unit that includes this header; only kernel files include it.
#include <immintrin.h>

#if defined(__GNUC__) && !defined(__clang__) && __GNUC__ < 13
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
