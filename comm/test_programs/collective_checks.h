#pragma once
// Correctness checks of a Communicator, shared by the in-process (threads) and the multi-process
// (zerorun) tests. Every rank calls the same function with the same arguments; each collective's
// result is compared bit for bit with a value computed independently on the host. Inputs are small
// integers, so sums are exact in every dtype and the expected bits are unambiguous; averages are
// expected as the fp32 (fp64 for fp64, truncated for integers) quotient rounded once to the dtype.
#include <cstddef>
#include <string>
#include <vector>

#include "comm/communicator.h"

namespace zero::comm::testing {

struct CheckReport {
  int checks = 0;
  std::vector<std::string> failures;  // at most a few per check, "all_reduce fp16 sum n=7: ..."

  void fail(std::string message);
  bool ok() const { return failures.empty(); }
  std::string summary() const;
};

struct SuiteOptions {
  // Element counts tried for every collective, dtype and reduce op.
  std::vector<size_t> sizes = {1, 7, 1000};
  // A large count (not a multiple of the rank count or 16), tried for sums of every dtype; 0 skips.
  size_t large = 1000003;
  // Issue several collectives before waiting on any (exercises the queue and issue order).
  bool batched = true;
};

// Element i of a buffer of dtype `t`, written from and read as a double (exact for the small
// integers the checks use).
void store_value(DType t, void* base, size_t i, double x);
double load_value(DType t, const void* base, size_t i);

// all_reduce (sum/avg/max/min), reduce_scatter (same, in and out of place), all_gather (in and out of
// place), broadcast (every root), all_to_all, barrier; over fp32, fp16, bf16, fp64, int32, int64
// (and uint8 for the data-movement ops).
void check_all_collectives(Communicator& comm, const SuiteOptions& options, CheckReport& report);

// fp16/bf16 sums must accumulate in fp32: rank 0 adds 2048 (bf16: 256), every other rank 1. A 16-bit
// accumulator would stay at 2048; fp32 gives 2048 + size - 1 rounded once. Needs size >= 3 to tell
// them apart (with 2 ranks both round once); checked either way.
void check_fp16_accumulation(Communicator& comm, CheckReport& report);

}  // namespace zero::comm::testing
