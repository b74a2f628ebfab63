#pragma once
// This process's resident memory (Linux /proc/self/status): the current size and the peak, for the
// examples' memory lines (the engine's tracker counts its own buffers; this counts everything).
#include <cstdint>
#include <fstream>
#include <string>

namespace zero::examples {

struct ProcessMemory {
  uint64_t rss = 0, peak_rss = 0;  // bytes; 0 where /proc is unavailable
};

inline ProcessMemory process_memory() {
  ProcessMemory m;
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);) {
    auto kib = [&](const char* key) { return std::stoull(line.substr(std::string(key).size())) * 1024; };
    if (line.rfind("VmRSS:", 0) == 0) m.rss = kib("VmRSS:");
    if (line.rfind("VmHWM:", 0) == 0) m.peak_rss = kib("VmHWM:");
  }
  return m;
}

}  // namespace zero::examples
