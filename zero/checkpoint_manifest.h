#pragma once
// The text side of a checkpoint's reader (the format in zero/checkpoint.h): manifest.json and the
// per-rank indexes rank-NNNNN.json, parsed and validated from their text alone. The checkpointer
// (zero/checkpoint.cc) does the file-system part (which files exist, their sizes and checksums) and
// calls these; keeping them apart lets the fuzzer (fuzz/manifest_fuzz.cc) feed them any text.
//
// Every error is InvalidArgument "checkpoint '<file>': <what>", naming the file and the field.
#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "base/check.h"
#include "base/dtype.h"

namespace zero {

// What the writer puts in the manifest's "format" and "version", and the kind of a user blob piece.
inline constexpr const char* kCheckpointFormat = "zero-checkpoint";
inline constexpr int kCheckpointVersion = 1;
inline constexpr const char* kCheckpointBlobKind = "user_blob";

// One piece as an index lists it: `bytes` bytes at `offset` of rank `file`'s data file, holding
// elements [begin, end) of kind `kind` in `dtype`.
struct SavedPiece {
  std::string kind;
  size_t begin = 0, end = 0;
  DType dtype = DType::kFloat32;
  int file = 0;  // rank
  uint64_t offset = 0, bytes = 0;
  uint32_t crc = 0;
};

struct Manifest {
  nlohmann::json doc;
  std::map<std::string, std::vector<SavedPiece>> pieces;  // by tensor name
  std::vector<SavedPiece> blobs;
  std::vector<std::string> files;  // data file paths by rank (filled in by the checkpointer)
};

// InvalidArgument "checkpoint '<where>': <what>".
[[noreturn]] void checkpoint_error(const std::string& where, const std::string& what);

// Field `key` of the object `j` as a T; the error names `where` and the key (missing, wrong type).
template <typename T>
T checkpoint_field(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) checkpoint_error(where, fmt::format("field '{}' is missing", key));
  try {
    return j.at(key).get<T>();
  } catch (const std::exception&) {
    checkpoint_error(where, fmt::format("field '{}' has the wrong type: {}", key, j.at(key).dump()));
  }
}

// `text` as JSON; "not JSON: ..." naming `path` otherwise.
nlohmann::json parse_checkpoint_json(std::string_view text, const std::string& path);

// manifest.json's text: JSON, the format and version this build reads, and a file list with one
// entry per saved rank (world_size). Returns a Manifest with only `doc` set; the entries' fields are
// read by the checkpointer as it checks the files they name.
Manifest parse_manifest(std::string_view text, const std::string& path);

// The pieces of rank `rank`'s parsed index `index` (from `index_path`) into `m`, each checked against
// its data file of `data_bytes` bytes: element range, byte count of its dtype, within the file.
void add_index_pieces(const nlohmann::json& index, const std::string& index_path, int rank, uint64_t data_bytes,
                      Manifest& m);

// parse_checkpoint_json then add_index_pieces: an index's text.
void parse_index(std::string_view text, const std::string& index_path, int rank, uint64_t data_bytes, Manifest& m);

}  // namespace zero
