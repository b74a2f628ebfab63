#pragma once
// The LibTorch tests' prelude: LibTorch first, then doctest. Debian's c10 includes glog, whose CHECK
// macros would replace doctest's; they are dropped in between. Include this before anything else.
#include <torch/torch.h>
#undef CHECK
#undef CHECK_EQ
#undef CHECK_NE
#undef CHECK_LT
#undef CHECK_LE
#undef CHECK_GT
#undef CHECK_GE

#include <doctest/doctest.h>

#include <mutex>

namespace zero::testing {

// LibTorch's default generator is one for the process: ranks as threads that build modules (and
// the references they are checked against) from a seed hold this while they draw.
inline std::mutex& generator_mutex() {
  static std::mutex mu;
  return mu;
}

}  // namespace zero::testing
