// The kernels' CPU level (cpu_level.hpp; docs/design.md "CPU dispatch in the portable build")
#include "cpu_level.hpp"

#include <cstdlib>
#include <string>

#include "formal_transformers/common.hpp"

namespace ft {

namespace {
// FT_CPU_LEVEL's level (checked in every build; a native build has one copy and ignores it); V4 when unset
CpuLevel wanted() {
    const char* env = std::getenv("FT_CPU_LEVEL");
    if (!env || !*env) return CpuLevel::V4;
    const std::string s(env);
    if (s == "baseline") return CpuLevel::Baseline;
    if (s == "x86-64-v3") return CpuLevel::V3;
    if (s == "x86-64-v4") return CpuLevel::V4;
    throw ValueError("FT_CPU_LEVEL must be baseline, x86-64-v3 or x86-64-v4, got '" + s + "'");
}

CpuLevel choose() {
    const CpuLevel want = wanted();
#if defined(FT_CPU_DISPATCH)
    __builtin_cpu_init();  // (libgcc checks that the OS saves the AVX / AVX-512 registers too)
    const CpuLevel best = __builtin_cpu_supports("x86-64-v4")   ? CpuLevel::V4
                          : __builtin_cpu_supports("x86-64-v3") ? CpuLevel::V3
                                                                : CpuLevel::Baseline;
    return want < best ? want : best;  // never above what the CPU runs
#else
    (void)want;
    return CpuLevel::Baseline;
#endif
}
}  // namespace

CpuLevel cpu_level() {
    static const CpuLevel level = choose();
    return level;
}

const char* cpu_level_info() {
    const CpuLevel level = cpu_level();  // (FT_CPU_LEVEL checked in every build)
#if defined(FT_CPU_DISPATCH)
    switch (level) {
        case CpuLevel::V4: return "x86-64-v4 (run-time choice)";
        case CpuLevel::V3: return "x86-64-v3 (run-time choice)";
        default: return "baseline x86-64 (run-time choice)";
    }
#elif defined(FT_CPU_NATIVE)
    (void)level;
    return "native (-march=native)";
#else
    (void)level;
    return "baseline (no run-time choice in this build)";
#endif
}

}  // namespace ft
