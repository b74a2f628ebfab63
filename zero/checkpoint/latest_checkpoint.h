#pragma once
// The checkpoint a restarted run resumes from (zerorun --max-restarts with train_gpt --resume auto,
// docs/reliability.md): the newest complete checkpoint that a run saving into DIR left.
//
// A save writes DIR.partial and then swaps it in: DIR becomes DIR.old, DIR.partial becomes DIR, and
// DIR.old is removed. A run killed between the two renames leaves its newest complete checkpoint
// in DIR.old and no DIR, and one killed while writing leaves DIR.partial beside an intact DIR; so
// the newest complete checkpoint is DIR or DIR.old, never DIR.partial.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace zero {

struct FoundCheckpoint {
  std::string dir;   // DIR or DIR.old: what Engine::load takes
  int64_t step = 0;  // the step it was saved after
};

// DIR or DIR.old, whichever is complete (every manifest and index readable and consistent, every
// data file of its size) with the higher step; nullopt when neither is (a run that never saved).
// `passed_over`, when given, gets a line per directory that exists but is not complete, saying why.
std::optional<FoundCheckpoint> latest_checkpoint(const std::string& dir,
                                                 std::vector<std::string>* passed_over = nullptr);

}  // namespace zero
