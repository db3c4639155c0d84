// Run-time CPU dispatch of the portable build (docs/design.md "CPU dispatch in the portable build").
//
// A build without -march=native (FT_NATIVE=OFF: the distributable wheel) compiles our hand-written kernels
// (listings/functions.cpp, listings/tiled_attention.cpp, listings/norm.cpp, Adam's kernel in listings/optim.cpp)
// three times: for baseline x86-64 into the namespace
// ft::cpu_base, and again (CMakeLists.txt: a wrapper that defines FT_CPU_NS and includes the source, with
// -march=x86-64-v3 or -v4 and -fno-weak, so that none of its inline functions can stand in for the baseline's)
// into ft::cpu_v3 and ft::cpu_v4. The public functions call the level cpu_level() chose once, from the CPU's
// features (or FT_CPU_LEVEL). A native build (FT_NATIVE=ON) compiles them once, into ft::cpu_base.
#pragma once

namespace ft {

enum class CpuLevel { Baseline, V3, V4 };

// The kernels' level, chosen once: the best this CPU runs (x86-64-v4: AVX-512 F/BW/DQ/VL; x86-64-v3: AVX2, FMA,
// BMI2), or the one FT_CPU_LEVEL names (baseline, x86-64-v3, x86-64-v4; never above the CPU's). A native build:
// Baseline (its one copy is compiled for this machine). Throws ValueError for an unknown FT_CPU_LEVEL.
CpuLevel cpu_level();
// "x86-64-v4 (run-time choice)" ..., or "native (-march=native)" in a native build: part of ft.blas_info().
const char* cpu_level_info();

}  // namespace ft

// The namespace this copy of a kernel source compiles into (the wrappers of the portable build set it)
#ifndef FT_CPU_NS
#define FT_CPU_NS cpu_base
#endif

// `return cpu_<level>::CALL;` for the chosen level (CALL: a function of the kernel source and its arguments; it may
// hold commas, e.g. template arguments)
#if defined(FT_CPU_DISPATCH)
#define FT_CPU_CALL(...)                                   \
    switch (::ft::cpu_level()) {                           \
        case ::ft::CpuLevel::V4: return cpu_v4::__VA_ARGS__; \
        case ::ft::CpuLevel::V3: return cpu_v3::__VA_ARGS__; \
        default: return cpu_base::__VA_ARGS__;             \
    }
#else
#define FT_CPU_CALL(...) return cpu_base::__VA_ARGS__;
#endif
