#pragma once
// The check that every rank of a communicator configured the same thing: the parameter registry's
// signature, the engine options' fingerprint. One rule for both: every rank sends its lines (or its
// local error), every rank compares them with rank 0's, and every rank throws the same
// InvalidArgument naming the first differing entry and the ranks that differ. Because every rank
// reaches the same verdict, a mistake on one rank can never leave the others waiting in a
// collective.
#include <chrono>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "memory/device.h"

namespace zero {

struct AgreementEntry {
  std::string key;    // what the entry is ("parameter #3", "EngineOptions.stage")
  std::string value;  // its value on this rank
};

struct AgreementSubject {
  std::string what;  // "parameter registration", "engine options"
  std::string verb;  // "registered", "has": "rank 0 <verb> <value> but rank 1 <verb> <value>"
};

// Collective. `local_error` (non-empty) replaces this rank's entries: every rank then throws
// "<what> failed on some ranks:" followed by each failing rank's error. A communicator that takes
// no host memory (NCCL) exchanges through buffers of `device`, which must then be given.
void check_agreement(comm::Communicator& comm, const AgreementSubject& subject,
                     const std::vector<AgreementEntry>& entries, const std::string& local_error,
                     std::chrono::milliseconds timeout, memory::Device* device = nullptr);

// Collective: every rank's entries, by rank, in the agreement's encoding (through buffers of
// `device` as above). Keys and values must not hold tabs or newlines.
std::vector<std::vector<AgreementEntry>> all_gather_entries(comm::Communicator& comm, memory::Device* device,
                                                          const std::vector<AgreementEntry>& entries,
                                                          std::chrono::milliseconds timeout);

// Collective: every rank's string, by rank (through buffers of `device` as above).
std::vector<std::string> all_gather_strings(comm::Communicator& comm, memory::Device* device, const std::string& mine,
                                            std::chrono::milliseconds timeout);

}  // namespace zero
