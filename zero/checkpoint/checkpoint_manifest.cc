#include "zero/checkpoint/checkpoint_manifest.h"

#include "layout/layout_json.h"

namespace zero {

std::string checkpoint_state_kind(const std::string& name) { return "state:" + name; }

std::string checkpoint_rank_file(int rank, const char* ext) { return fmt::format("rank-{:05d}.{}", rank, ext); }

std::string checkpoint_part_dir(int rank) { return fmt::format("part-{:05d}", rank); }

using json = nlohmann::json;

void checkpoint_error(const std::string& where, const std::string& what) {
  ZERO_THROW(InvalidArgument, "checkpoint '{}': {}", where, what);
}

json parse_checkpoint_json(std::string_view text, const std::string& path) {
  try {
    return json::parse(text);
  } catch (const json::exception& e) {
    checkpoint_error(path, fmt::format("not JSON: {}", e.what()));
  }
}

Manifest parse_manifest(std::string_view text, const std::string& path) {
  Manifest m;
  m.doc = parse_checkpoint_json(text, path);
  if (checkpoint_field<std::string>(m.doc, "format", path) != kCheckpointFormat) {
    checkpoint_error(path, "not a zero checkpoint manifest");
  }
  const int version = checkpoint_field<int>(m.doc, "version", path);
  if (version < kCheckpointOldestVersion || version > kCheckpointVersion) {
    checkpoint_error(path, fmt::format("format version {} (this build reads {} to {})", version,
                                       kCheckpointOldestVersion, kCheckpointVersion));
  }
  if (version >= 2 && m.doc.contains("parts")) {
    const auto parts = checkpoint_field<std::vector<std::string>>(m.doc, "parts", path);
    if (parts.empty()) checkpoint_error(path, "the part list is empty");
    for (const std::string& part : parts) {
      if (part.empty() || part.find('/') != std::string::npos || part == "." || part == "..") {
        checkpoint_error(path, fmt::format("part '{}' is not a directory name", part));
      }
    }
    checkpoint_field<int64_t>(m.doc, "step", path);
    return m;
  }
  const json files = checkpoint_field<json>(m.doc, "files", path);
  if (!files.is_array() || files.size() != checkpoint_field<size_t>(m.doc, "world_size", path)) {
    checkpoint_error(path, "the file list does not have one entry per saved rank");
  }
  return m;
}

bool is_composite(const Manifest& m) { return m.doc.is_object() && m.doc.contains("parts"); }

std::optional<Layout> saved_layout(const json& doc, const std::string& path) {
  if (!doc.is_object() || !doc.contains("layout")) return std::nullopt;
  try {
    return read_layout_json(doc["layout"], "layout", LayoutFields::kAll);
  } catch (const InvalidArgument& e) {
    checkpoint_error(path, e.what());
  }
}

namespace {

// A piece's "encoding" (state_encoding.h): of an optimizer state, fp32 once decoded, its block in
// [1, 2^30].
StateEncoding parse_encoding(const json& pj, const SavedPiece& sp, const std::string& index_path) {
  const std::string name = checkpoint_field<std::string>(pj, "name", index_path);
  const json& ej = pj["encoding"];
  auto bad = [&](const std::string& what) {
    checkpoint_error(index_path, fmt::format("piece {} [{}, {}) of '{}': {}", sp.kind, sp.begin, sp.end, name, what));
  };
  StateEncoding e;
  const std::string kind = checkpoint_field<std::string>(ej, "kind", index_path);
  if (!parse_state_encoding_kind(kind, &e.kind)) bad(fmt::format("unknown encoding '{}'", kind));
  if (sp.kind.rfind(checkpoint_state_kind(""), 0) != 0 || sp.dtype != DType::kFloat32) {
    bad("only an fp32 optimizer state is stored encoded");
  }
  e.block = checkpoint_field<size_t>(ej, "block", index_path);
  if (e.block == 0 || e.block > (size_t{1} << 30)) bad(fmt::format("encoding block {} (1 to 2^30)", e.block));
  if (ej.contains("phase")) {
    e.phase = checkpoint_field<size_t>(ej, "phase", index_path);
    if (e.kind != StateEncoding::Kind::kBlockConstant || e.phase >= e.block) {
      bad(fmt::format("encoding phase {} ({} in blocks of {})", e.phase, kind, e.block));
    }
  }
  if (e.kind == StateEncoding::Kind::kDynamic8) {
    const std::string map = checkpoint_field<std::string>(ej, "map", index_path);
    if (map != "signed" && map != "unsigned") bad(fmt::format("dynamic8 map '{}' (signed or unsigned)", map));
    e.is_signed = map == "signed";
  }
  return e;
}

// Whether a piece's byte count is what its element count takes (its end not before its begin).
bool counted_bytes(const SavedPiece& sp) {
  const uint64_t n = sp.end - sp.begin;
  const StateEncoding& e = sp.encoding;
  if (e.kind == StateEncoding::Kind::kNone) {
    const uint64_t es = dtype_size(sp.dtype);
    return sp.bytes % es == 0 && sp.bytes / es == n;
  }
  const uint64_t stored = e.stored(n);  // parse_encoding checked block and phase
  if (stored > sp.bytes / sizeof(float)) return false;
  const uint64_t values = stored * sizeof(float);
  return e.kind == StateEncoding::Kind::kDynamic8 ? sp.bytes - values == n : sp.bytes == values;
}

}  // namespace

void add_index_pieces(const json& index, const std::string& index_path, int rank, uint64_t data_bytes, Manifest& m) {
  for (const json& pj : checkpoint_field<json>(index, "pieces", index_path)) {
    SavedPiece sp;
    sp.kind = checkpoint_field<std::string>(pj, "kind", index_path);
    sp.begin = checkpoint_field<size_t>(pj, "begin", index_path);
    sp.end = checkpoint_field<size_t>(pj, "end", index_path);
    const std::string dtype = checkpoint_field<std::string>(pj, "dtype", index_path);
    try {
      sp.dtype = parse_dtype(dtype);
    } catch (const InvalidArgument& e) {
      // parse_dtype's message says what is wrong but not where.
      checkpoint_error(index_path, fmt::format("field 'dtype': {}", e.what()));
    }
    sp.file = rank;
    sp.offset = checkpoint_field<uint64_t>(pj, "offset", index_path);
    sp.bytes = checkpoint_field<uint64_t>(pj, "bytes", index_path);
    sp.crc = checkpoint_field<uint32_t>(pj, "crc32c", index_path);
    if (pj.contains("encoding")) sp.encoding = parse_encoding(pj, sp, index_path);
    // Checked without overflow: the loader allocates `bytes` and copies (end - begin) elements out of
    // them, so a count whose byte count wraps past 2^64 (end 2^62 of fp32 in 0 bytes) or an offset
    // that wraps past the end of the file must not pass. An encoded piece's bytes are its encoding's.
    const bool consistent = sp.end >= sp.begin && counted_bytes(sp) && sp.offset <= data_bytes &&
                            sp.bytes <= data_bytes - sp.offset;
    if (!consistent) {
      checkpoint_error(index_path, fmt::format("piece {} [{}, {}) of '{}' is inconsistent", sp.kind, sp.begin, sp.end,
                                               checkpoint_field<std::string>(pj, "name", index_path)));
    }
    if (sp.kind == kCheckpointBlobKind) {
      m.blobs.push_back(sp);
    } else {
      m.pieces[checkpoint_field<std::string>(pj, "name", index_path)].push_back(sp);
    }
  }
}

void parse_index(std::string_view text, const std::string& index_path, int rank, uint64_t data_bytes, Manifest& m) {
  add_index_pieces(parse_checkpoint_json(text, index_path), index_path, rank, data_bytes, m);
}

}  // namespace zero
