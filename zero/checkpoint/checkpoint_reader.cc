#include "base/check.h"
#include "base/error.h"
#include "zero/checkpoint/checkpoint_reader.h"

#include <sys/stat.h>

#include <algorithm>
#include <cstring>

#include "zero/checkpoint/crc32c.h"
#include "zero/checkpoint/state_encoding.h"

namespace zero {

using json = nlohmann::json;

Manifest read_manifest(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  if (!path_exists(path)) {
    std::string hint;
    if (path_exists(dir + ".partial")) hint = fmt::format("; '{}.partial' is a save still running or interrupted", dir);
    if (path_exists(dir + ".old")) hint += fmt::format("; '{}.old' holds the previous complete checkpoint", dir);
    checkpoint_error(dir, (path_exists(dir) ? "no manifest.json: not a complete checkpoint" : "no such directory") + hint);
  }
  Manifest m = parse_manifest(read_whole_file(path), path);
  const json files = checkpoint_field<json>(m.doc, "files", path);
  for (size_t r = 0; r < files.size(); ++r) {
    const json& f = files[r];
    const std::string index_path = dir + "/" + checkpoint_field<std::string>(f, "index", path);
    if (!path_exists(index_path)) checkpoint_error(index_path, fmt::format("missing (the index of rank {})", r));
    const std::string text = read_whole_file(index_path);
    if (crc32c(text.data(), text.size()) != checkpoint_field<uint32_t>(f, "index_crc32c", path)) {
      checkpoint_error(index_path, "checksum mismatch: the index was changed or damaged after the save");
    }
    const json index = parse_checkpoint_json(text, index_path);
    const std::string data_path = dir + "/" + checkpoint_field<std::string>(f, "file", path);
    if (!path_exists(data_path)) checkpoint_error(data_path, fmt::format("missing (the data of rank {})", r));
    struct stat st {};
    ::stat(data_path.c_str(), &st);
    if (static_cast<uint64_t>(st.st_size) != checkpoint_field<uint64_t>(f, "bytes", path)) {
      checkpoint_error(data_path, fmt::format("{} bytes, the manifest says {}: the file is truncated or was replaced",
                                 static_cast<uint64_t>(st.st_size), checkpoint_field<uint64_t>(f, "bytes", path)));
    }
    m.files.push_back(data_path);
    add_index_pieces(index, index_path, static_cast<int>(r), static_cast<uint64_t>(st.st_size), m);
  }
  return m;
}

const std::vector<char>& PieceReader::bytes(const SavedPiece& sp) {
  const auto key = std::make_pair(sp.file, sp.offset);
  auto it = cache_.find(key);
  if (it != cache_.end()) return it->second;
  std::vector<char> buf(sp.bytes);
  file(sp.file).read(buf.data(), buf.size(), sp.offset);
  verify(sp, buf.data());
  return cache_.emplace(key, std::move(buf)).first->second;
}

void PieceReader::verify_only(const SavedPiece& sp) {
  if (!verified_.insert({sp.file, sp.offset}).second) return;
  scratch_.resize(std::min<uint64_t>(sp.bytes, uint64_t{8} << 20));
  uint32_t crc = 0;
  for (uint64_t at = 0; at < sp.bytes; at += scratch_.size()) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(scratch_.size(), sp.bytes - at));
    file(sp.file).read(scratch_.data(), n, sp.offset + at);
    crc = crc32c(scratch_.data(), n, crc);
  }
  if (crc != sp.crc) fail(sp);
}

void PieceReader::read_into(const SavedPiece& sp, void* out) {
  file(sp.file).read(out, sp.bytes, sp.offset);
  verify(sp, out);
}

void PieceReader::verify(const SavedPiece& sp, const void* bytes) const {
  if (crc32c(bytes, sp.bytes) != sp.crc) fail(sp);
}

void PieceReader::fail(const SavedPiece& sp) const {
  checkpoint_error(m_.files[static_cast<size_t>(sp.file)],
      fmt::format("checksum mismatch in piece {} [{}, {}) at byte {}: the file is damaged", sp.kind, sp.begin, sp.end,
                  sp.offset));
}

const FileReader& PieceReader::file(int r) {
  auto it = readers_.find(r);
  if (it == readers_.end()) it = readers_.emplace(r, std::make_unique<FileReader>(m_.files[static_cast<size_t>(r)])).first;
  return *it->second;
}

void gather_range(const Manifest& m, PieceReader& reader, const std::string& name, const std::string& kind,
                  size_t begin, size_t end, void* out, DType dtype, const std::string& path) {
  size_t covered = 0;
  const size_t es = dtype_size(dtype);
  const auto it = m.pieces.find(name);
  if (it != m.pieces.end()) {
    for (const SavedPiece& sp : it->second) {
      if (sp.kind != kind || sp.end <= begin || sp.begin >= end) continue;
      if (sp.dtype != dtype) {
        checkpoint_error(path, fmt::format("piece {} of '{}' is {}, not {}", kind, name, dtype_name(sp.dtype), dtype_name(dtype)));
      }
      const size_t lo = std::max(begin, sp.begin), hi = std::min(end, sp.end);
      if (out == nullptr) {
        reader.verify_only(sp);
      } else if (sp.encoding.kind != StateEncoding::Kind::kNone) {
        decode_state(sp.encoding, reader.bytes(sp).data(), sp.end - sp.begin, lo - sp.begin, hi - sp.begin,
                     reinterpret_cast<float*>(static_cast<char*>(out) + (lo - begin) * es));
      } else if (lo == sp.begin && hi == sp.end) {
        reader.read_into(sp, static_cast<char*>(out) + (lo - begin) * es);  // the whole piece is wanted
      } else {
        const std::vector<char>& bytes = reader.bytes(sp);
        std::memcpy(static_cast<char*>(out) + (lo - begin) * es, bytes.data() + (lo - sp.begin) * es, (hi - lo) * es);
      }
      covered += hi - lo;
    }
  }
  if (covered != end - begin) {
    checkpoint_error(path, fmt::format("holds {} of the {} elements [{}, {}) of '{}' ({}) this rank needs", covered, end - begin,
                          begin, end, name, kind));
  }
}

}  // namespace zero
