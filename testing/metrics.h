#pragma once
// train_gpt's --metrics FILE read back (examples/gpt/progress_log.h): the value of `key` on each line
// that has it, in order ("loss" of every logged step, "validation_loss" of every validation). A
// missing or unreadable file is an error naming it.
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/check.h"

namespace zero::testing {

inline std::vector<double> metric(const std::string& path, const std::string& key) {
  std::ifstream in(path);
  if (!in) ZERO_THROW(IoError, "metrics file {}: cannot read it", path);
  std::vector<double> out;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains(key)) out.push_back(j.at(key).get<double>());
  }
  return out;
}

}  // namespace zero::testing
