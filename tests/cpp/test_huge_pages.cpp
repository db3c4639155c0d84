// The buffers a training step streams whole (θ, its gradient, Adam's moments) are allocated zero-filled with their
// whole 2 MB pages advised huge before the first write (runtime/huge_pages.hpp). On Linux the advice shows in
// /proc/self/smaps as the "hg" flag of the mapping that holds the buffer's interior (whatever pages the kernel
// then gives); the contents are the zeros allocate() and Adam's first step always gave.
#include "formal_transformers/optim.hpp"
#include "testing.hpp"

#include <cstdint>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

using namespace ft;

namespace {
// The VmFlags of the mapping holding address p (empty when none is found, or off Linux)
std::string vm_flags(const void* p) {
    std::ifstream smaps("/proc/self/smaps");
    const auto at = std::uintptr_t(p);
    std::string line;
    bool inside = false;
    while (std::getline(smaps, line)) {
        std::uintptr_t lo = 0, hi = 0;
        char dash = 0;
        std::istringstream head(line);
        if (head >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(':') > line.find(' ')) {
            inside = lo <= at && at < hi;
            continue;
        }
        if (inside && line.rfind("VmFlags:", 0) == 0) return line;
    }
    return "";
}
// the first whole 2 MB page inside [p, p + bytes)
const void* first_huge_page(const void* p) {
    constexpr std::uintptr_t huge = std::uintptr_t(1) << 21;
    return reinterpret_cast<const void*>((std::uintptr_t(p) + huge - 1) & ~(huge - 1));
}
bool advised_huge(const void* p) { return vm_flags(first_huge_page(p)).find(" hg") != std::string::npos; }
}  // namespace

TEST(HugePages, ThetaGradientAndMomentsAreZerosAdvisedHuge) {
    const index_t n = index_t(3) << 20;  // 12 MB of float32: whole 2 MB pages inside each buffer
    ParamStore<float> s;
    s.vector("theta", n);
    s.allocate();
    for (index_t i = 0; i < n; ++i) ASSERT_EQ(s.theta()[i], 0.0f);
    for (index_t i = 0; i < n; ++i) ASSERT_EQ(s.grad()[i], 0.0f);
    Adam<float> adam(1e-3);
    std::vector<float> g(std::size_t(n), 0.0f);
    adam.step(s, g.data());
    ASSERT_EQ(adam.m.size(), std::size_t(n));
    for (float x : adam.m) ASSERT_EQ(x, 0.0f);
    for (float x : adam.v) ASSERT_EQ(x, 0.0f);
#if defined(__linux__)
    // a kernel built without transparent huge pages refuses the advice (no such directory): then no flag either
    const bool thp = std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled").good();
    EXPECT_EQ(advised_huge(s.theta()), thp) << vm_flags(first_huge_page(s.theta()));
    EXPECT_EQ(advised_huge(s.grad()), thp) << vm_flags(first_huge_page(s.grad()));
    EXPECT_EQ(advised_huge(adam.m.data()), thp) << vm_flags(first_huge_page(adam.m.data()));
    EXPECT_EQ(advised_huge(adam.v.data()), thp) << vm_flags(first_huge_page(adam.v.data()));
#endif
}
