#pragma once
// The text side of a checkpoint's reader (the format in zero/checkpoint/checkpoint.h): manifest.json
// and the per-rank indexes rank-NNNNN.json, parsed and validated from their text alone. The reader
// (zero/checkpoint/checkpoint_reader.cc) does the file-system part (which files exist, their sizes and
// checksums) and calls these; keeping them apart lets the fuzzer (fuzz/manifest_fuzz.cc) feed them any
// text.
//
// Every error is InvalidArgument "checkpoint '<file>': <what>", naming the file and the field.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <optional>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "base/check.h"
#include "base/dtype.h"
#include "layout/layout.h"
#include "zero/checkpoint/state_encoding.h"

namespace zero {

// What the writer puts in the manifest's "format" and "version", and the kinds of piece an index
// lists: the fp32 master, an optimizer state (checkpoint_state_kind), the parameters in the model
// dtype, a frozen parameter whole in its own dtype, and a rank's user blob.
inline constexpr const char* kCheckpointFormat = "zero-checkpoint";
// Version 2 (tensor parallelism): a parameter's "shape" is the whole tensor's, and one saved as a
// tensor-parallel part says which ("tp": parts, part, dim, blocks; its pieces' ranges are in the
// part); a model-parallel run writes one directory per (tp, pp) coordinate under a top manifest
// that lists them ("parts") and the layout. Version 1 (no tp) reads as version 2 without parts.
// Version 3: a piece of an optimizer state may be stored encoded (its index entry's "encoding":
// zero/checkpoint/state_encoding.h); versions 1 and 2 have none.
inline constexpr int kCheckpointVersion = 3;
inline constexpr int kCheckpointOldestVersion = 1;
inline constexpr const char* kCheckpointMasterKind = "master";
inline constexpr const char* kCheckpointParamsKind = "params";
inline constexpr const char* kCheckpointFrozenKind = "frozen";
inline constexpr const char* kCheckpointBlobKind = "user_blob";
// The manifest's model_dtype where the trainable parameters mix dtypes (each piece says its own).
inline constexpr const char* kCheckpointMixedDtypes = "mixed";

// "state:<name>": the kind of optimizer state `name` (e.g. "state:exp_avg").
std::string checkpoint_state_kind(const std::string& name);
// "rank-NNNNN.<ext>": rank `rank`'s data file (bin), index (json) or failure note (failed).
std::string checkpoint_rank_file(int rank, const char* ext);

// "part-NNNNN": the directory of the engine at model-parallel rank `rank` under a model-parallel
// checkpoint.
std::string checkpoint_part_dir(int rank);

// One piece as an index lists it: `bytes` bytes at `offset` of rank `file`'s data file, holding
// elements [begin, end) of kind `kind` in `dtype`.
struct SavedPiece {
  std::string kind;
  size_t begin = 0, end = 0;
  DType dtype = DType::kFloat32;
  int file = 0;  // rank
  uint64_t offset = 0, bytes = 0;
  uint32_t crc = 0;
  StateEncoding encoding;  // how an optimizer state's piece is stored (kNone: `dtype` per element)
};

struct Manifest {
  nlohmann::json doc;
  std::map<std::string, std::vector<SavedPiece>> pieces;  // by tensor name
  std::vector<SavedPiece> blobs;
  std::vector<std::string> files;  // data file paths by rank (filled in by the checkpointer)
};

// InvalidArgument "checkpoint '<where>': <what>".
[[noreturn]] void checkpoint_error(const std::string& where, const std::string& what);

namespace detail {

template <typename T>
struct IsVector : std::false_type {};
template <typename T>
struct IsVector<std::vector<T>> : std::true_type {};

template <typename T>
constexpr bool kIsNumber = std::is_arithmetic_v<T> && !std::is_same_v<T, bool>;

enum class Fit { kOk, kWrongType, kOutOfRange };

// Whether the JSON value `v` converts to the number type T exactly. Checked before converting:
// nlohmann converts a float to an integer with a plain cast, which is undefined behaviour when the
// value does not fit (a fuzzed index had "begin": 2e113) and truncates when it does, and it wraps an
// integer that is out of the type's range (a version 4294967297 would read as 1). So an integer
// field takes an integer within its type's range, a float field a finite number within its range.
template <typename T>
Fit number_fit(const nlohmann::json& v) {
  if constexpr (std::is_integral_v<T>) {
    if (!v.is_number_integer()) return Fit::kWrongType;
    const bool fits = v.is_number_unsigned() ? std::in_range<T>(v.get<uint64_t>()) : std::in_range<T>(v.get<int64_t>());
    return fits ? Fit::kOk : Fit::kOutOfRange;
  } else {
    if (!v.is_number()) return Fit::kWrongType;
    const double d = v.get<double>();
    return std::isfinite(d) && std::fabs(d) <= static_cast<double>(std::numeric_limits<T>::max()) ? Fit::kOk
                                                                                                  : Fit::kOutOfRange;
  }
}

// `v`, the value of field `key`, as a T: numbers and lists of numbers checked with number_fit, other
// types converted by nlohmann (which throws on a mismatch). The error shows the whole value.
template <typename T>
T checkpoint_value(const nlohmann::json& v, const char* key, const std::string& where) {
  auto fail = [&](Fit f) {
    checkpoint_error(where, fmt::format("field '{}' {}: {}", key,
                                        f == Fit::kOutOfRange ? "is out of range" : "has the wrong type", v.dump()));
  };
  if constexpr (kIsNumber<T>) {
    if (const Fit f = number_fit<T>(v); f != Fit::kOk) fail(f);
  } else if constexpr (IsVector<T>::value) {
    if constexpr (kIsNumber<typename T::value_type>) {
      if (!v.is_array()) fail(Fit::kWrongType);
      for (const nlohmann::json& e : v) {
        if (const Fit f = number_fit<typename T::value_type>(e); f != Fit::kOk) fail(f);
      }
    }
  }
  try {
    return v.get<T>();
  } catch (const std::exception&) {
    fail(Fit::kWrongType);
  }
  return T();  // not reached: fail throws
}

}  // namespace detail

// Field `key` of the object `j` as a T; the error names `where` and the key (missing, wrong type,
// out of the type's range).
template <typename T>
T checkpoint_field(const nlohmann::json& j, const char* key, const std::string& where) {
  if (!j.is_object() || !j.contains(key)) checkpoint_error(where, fmt::format("field '{}' is missing", key));
  return detail::checkpoint_value<T>(j.at(key), key, where);
}

// `text` as JSON; "not JSON: ..." naming `path` otherwise.
nlohmann::json parse_checkpoint_json(std::string_view text, const std::string& path);

// manifest.json's text: JSON, the format and a version this build reads, and either a file list with
// one entry per saved rank (world_size) or, for a model-parallel checkpoint, a non-empty list of
// part directories ("parts"). Returns a Manifest with only `doc` set; the entries' fields are read
// by the checkpointer as it checks the files they name.
Manifest parse_manifest(std::string_view text, const std::string& path);

// Whether a parsed manifest is a model-parallel checkpoint's top manifest (its "parts").
bool is_composite(const Manifest& m);

// The layout a manifest records ("layout": what the save was run at, layout/layout_json.h; a load
// needs none of it), or nullopt for a version-1 manifest, which has none. A run without a layout of
// its own (a mesh built from sizes, or none) records the fields the engine knows: dp, shard, tp, pp,
// stage and offload.
std::optional<Layout> saved_layout(const nlohmann::json& doc, const std::string& path);

// The pieces of rank `rank`'s parsed index `index` (from `index_path`) into `m`, each checked against
// its data file of `data_bytes` bytes: element range, byte count of its dtype, within the file.
void add_index_pieces(const nlohmann::json& index, const std::string& index_path, int rank, uint64_t data_bytes,
                      Manifest& m);

// parse_checkpoint_json then add_index_pieces: an index's text.
void parse_index(std::string_view text, const std::string& index_path, int rank, uint64_t data_bytes, Manifest& m);

}  // namespace zero
