// Fuzz target: the checkpoint manifest and index reader (zero/checkpoint/checkpoint_manifest.h), the input
// being the text of a manifest.json or of a rank-NNNNN.json; each input is read as both.
//
// A bad text must end in a zero::Error naming the file. As a manifest, what parses is then read
// field by field the way the checkpointer reads it (the file list's entries in read_manifest, the
// head in inspect_checkpoint and load_checkpoint). As an index, every accepted piece must be what
// the loader relies on when it allocates a piece's bytes and copies elements out of them: a range
// whose element count times the dtype size is exactly its byte count, within the data file.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "fuzz/fuzz_check.h"
#include "zero/checkpoint/checkpoint_manifest.h"

namespace {

using zero::checkpoint_field;
using json = nlohmann::json;

const std::string kManifest = "fuzz/manifest.json";
const std::string kIndex = "fuzz/rank-00000.json";
// The data file the index is checked against (its size comes from stat(), not from the text).
constexpr uint64_t kDataBytes = uint64_t{1} << 20;

void manifest(std::string_view text) {
  try {
    const zero::Manifest m = zero::parse_manifest(text, kManifest);
    for (const json& f : checkpoint_field<json>(m.doc, "files", kManifest)) {
      checkpoint_field<std::string>(f, "index", kManifest);
      checkpoint_field<uint32_t>(f, "index_crc32c", kManifest);
      checkpoint_field<std::string>(f, "file", kManifest);
      checkpoint_field<uint64_t>(f, "bytes", kManifest);
      checkpoint_field<uint32_t>(f, "crc32c", kManifest);
    }
    checkpoint_field<int64_t>(m.doc, "step", kManifest);
    checkpoint_field<int>(m.doc, "world_size", kManifest);
    checkpoint_field<int>(m.doc, "stage", kManifest);
    zero::parse_dtype(checkpoint_field<std::string>(m.doc, "model_dtype", kManifest));
    const json opt = checkpoint_field<json>(m.doc, "optimizer", kManifest);
    checkpoint_field<std::string>(opt, "kind", kManifest);
    checkpoint_field<std::vector<std::string>>(opt, "states", kManifest);
    for (const json& p : checkpoint_field<json>(m.doc, "params", kManifest)) {
      checkpoint_field<std::string>(p, "name", kManifest);
      checkpoint_field<std::vector<int64_t>>(p, "shape", kManifest);
      zero::parse_dtype(checkpoint_field<std::string>(p, "dtype", kManifest));
      checkpoint_field<bool>(p, "trainable", kManifest);
    }
    // load_checkpoint reads it through a non-const operator[], which makes a missing key null.
    const json sc = m.doc.contains("loss_scaler") ? m.doc.at("loss_scaler") : json();
    if (!sc.is_null()) {
      checkpoint_field<float>(sc, "scale", kManifest);
      checkpoint_field<int64_t>(sc, "good_steps_since_growth", kManifest);
      checkpoint_field<int>(sc, "hysteresis_left", kManifest);
      checkpoint_field<int64_t>(sc, "skipped_steps", kManifest);
      checkpoint_field<int64_t>(sc, "steps", kManifest);
    }
  } catch (const zero::Error&) {
  }
}

void check_piece(const zero::SavedPiece& sp, const std::string& name) {
  const uint64_t es = zero::dtype_size(sp.dtype);
  FUZZ_CHECK(sp.begin <= sp.end, "piece %s of '%s' ends before it begins", sp.kind.c_str(), name.c_str());
  const zero::StateEncoding& e = sp.encoding;
  if (e.kind == zero::StateEncoding::Kind::kNone) {
    // Division instead of the product: an element count whose byte count wraps around must not pass.
    FUZZ_CHECK(sp.bytes % es == 0 && sp.bytes / es == sp.end - sp.begin,
               "piece %s of '%s': [%zu, %zu) of a %llu-byte dtype in %llu bytes", sp.kind.c_str(), name.c_str(),
               sp.begin, sp.end, static_cast<unsigned long long>(es), static_cast<unsigned long long>(sp.bytes));
  } else {
    // An encoded state: fp32 once decoded, a scale per block (and a code per element), no wrap.
    FUZZ_CHECK(sp.dtype == zero::DType::kFloat32 && sp.kind.rfind("state:", 0) == 0 && e.block > 0,
               "encoded piece %s of '%s' is not an fp32 state with a block", sp.kind.c_str(), name.c_str());
    FUZZ_CHECK(e.phase < e.block, "encoded piece %s of '%s': phase %zu in blocks of %zu", sp.kind.c_str(),
               name.c_str(), e.phase, e.block);
    const uint64_t n = sp.end - sp.begin;
    uint64_t blocks = n / e.block + (n % e.block != 0 ? 1 : 0);
    if (e.kind == zero::StateEncoding::Kind::kPeriodic) blocks = n < e.block ? n : e.block;
    if (e.kind == zero::StateEncoding::Kind::kBlockConstant && n > 0) blocks = (n - 1 + e.phase) / e.block + 1;
    const uint64_t codes = e.kind == zero::StateEncoding::Kind::kDynamic8 ? n : 0;
    FUZZ_CHECK(blocks <= sp.bytes / 4 && sp.bytes - 4 * blocks == codes,
               "encoded piece %s of '%s': [%zu, %zu) in blocks of %zu in %llu bytes", sp.kind.c_str(), name.c_str(),
               sp.begin, sp.end, e.block, static_cast<unsigned long long>(sp.bytes));
  }
  FUZZ_CHECK(sp.offset <= kDataBytes && sp.bytes <= kDataBytes - sp.offset,
             "piece %s of '%s': %llu bytes at %llu, past the %llu-byte data file", sp.kind.c_str(), name.c_str(),
             static_cast<unsigned long long>(sp.bytes), static_cast<unsigned long long>(sp.offset),
             static_cast<unsigned long long>(kDataBytes));
}

void index(std::string_view text) {
  zero::Manifest m;
  try {
    zero::parse_index(text, kIndex, 0, kDataBytes, m);
  } catch (const zero::Error&) {
    return;
  }
  for (const auto& [name, pieces] : m.pieces) {
    for (const zero::SavedPiece& sp : pieces) check_piece(sp, name);
  }
  for (const zero::SavedPiece& sp : m.blobs) check_piece(sp, "(user blob)");
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  manifest(text);
  index(text);
  return 0;
}
