// A stand-in for <metal_stdlib> so that clang (C++17) can syntax-check rendered Metal kernels.
// It declares only what tgrad's Metal dialect uses; anything else the renderer emits is an error.
#pragma once

#define kernel
#define device
#define threadgroup
#define INFINITY __builtin_inff()
#define NAN __builtin_nanf("")

typedef _Float16 half;
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;

namespace metal {
enum class mem_flags { mem_none, mem_device, mem_threadgroup, mem_texture };
void threadgroup_barrier(mem_flags flags);

// Metal has float and half versions of each math function (no double)
#define TGRAD_UNARY(name) \
    float name(float x);  \
    half name(half x);
TGRAD_UNARY(exp2)
TGRAD_UNARY(log2)
TGRAD_UNARY(sin)
TGRAD_UNARY(sqrt)
TGRAD_UNARY(trunc)
#undef TGRAD_UNARY
float fmod(float x, float y);
half fmod(half x, half y);
bool isfinite(float x);  // Kahan sums (emit_cstyle.kahan_add)
bool isfinite(half x);
}  // namespace metal
