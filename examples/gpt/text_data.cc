#include "examples/gpt/text_data.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "base/check.h"
#include "base/splitmix64.h"

namespace zero::examples {
namespace {

namespace fs = std::filesystem;

void append_file(const fs::path& p, std::vector<uint8_t>* out) {
  std::ifstream in(p, std::ios::binary);
  if (!in) ZERO_THROW(IoError, "cannot read '{}'", p.string());
  out->insert(out->end(), std::istreambuf_iterator<char>(in), {});
}

}  // namespace

std::string default_corpus() { return "/usr/share/common-licenses"; }

TextData::TextData(const std::string& path, int block, double val_fraction, uint64_t seed)
    : source_(path), block_(block), seed_(seed) {
  std::vector<uint8_t> all;
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(path)) {
      if (e.is_regular_file() && !e.is_symlink()) files.push_back(e.path());
    }
    std::sort(files.begin(), files.end());
    for (const fs::path& f : files) append_file(f, &all);
  } else {
    append_file(path, &all);
  }
  if (all.empty()) ZERO_THROW(IoError, "no text in '{}'", path);
  const size_t val = static_cast<size_t>(static_cast<double>(all.size()) * val_fraction);
  const size_t need = static_cast<size_t>(block) + 1;
  if (all.size() - val < need || val < need) {
    ZERO_THROW(InvalidArgument, "'{}' has {} bytes: too short for sequences of {} in both splits", path, all.size(),
               need);
  }
  train_.assign(all.begin(), all.end() - static_cast<std::ptrdiff_t>(val));
  val_.assign(all.end() - static_cast<std::ptrdiff_t>(val), all.end());
}

void TextData::batch(int64_t step, int first, int count, bool validation, std::vector<int>* inputs,
                     std::vector<int>* targets) const {
  const std::vector<uint8_t>& text = validation ? val_ : train_;
  const uint64_t positions = text.size() - static_cast<size_t>(block_);
  inputs->clear();
  targets->clear();
  for (int j = first; j < first + count; ++j) {
    // A position from (seed, step, index) alone.
    const uint64_t key = splitmix64(splitmix64(seed_ ^ (validation ? 0x5a5a5a5aull : 0)) ^
                                    splitmix64(static_cast<uint64_t>(step) * 1000003 + j));
    const size_t at = static_cast<size_t>(key % positions);
    for (int t = 0; t < block_; ++t) {
      inputs->push_back(text[at + static_cast<size_t>(t)]);
      targets->push_back(text[at + static_cast<size_t>(t) + 1]);
    }
  }
}

double TextData::unigram_entropy() const {
  std::vector<double> count(256, 0.0);
  for (uint8_t b : train_) count[b] += 1;
  double h = 0;
  for (double c : count) {
    if (c > 0) h -= c / static_cast<double>(train_.size()) * std::log(c / static_cast<double>(train_.size()));
  }
  return h;
}

std::vector<int> TextData::prompt(const std::string& marker, size_t n) const {
  auto at = std::search(train_.begin(), train_.end(), marker.begin(), marker.end());
  if (at == train_.end()) at = train_.begin();
  n = std::min(n, static_cast<size_t>(train_.end() - at));
  return std::vector<int>(at, at + static_cast<std::ptrdiff_t>(n));
}

}  // namespace zero::examples
