#pragma once
// A checkpoint directory read back: the manifest with every rank's index checked against the files
// it names, and the pieces read with their checksums verified. The engine's load and the offline
// tools (zero_ckpt) share it; it knows nothing of an engine.
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "base/dtype.h"
#include "zero/checkpoint/checkpoint_manifest.h"
#include "zero/checkpoint/file_io.h"

namespace zero {

// The manifest of `dir`, every index present, unchanged since the save (its checksum in the
// manifest) and consistent with its data file's size; Manifest::files holds the data files' paths.
// A missing manifest says whether a save is still running (DIR.partial) or left DIR.old.
Manifest read_manifest(const std::string& dir);

// Reads saved pieces from the manifest's data files, each verified against its CRC-32C; a mismatch
// names the file, the piece and its byte offset.
class PieceReader {
 public:
  explicit PieceReader(const Manifest& m) : m_(m) {}
  // The saved piece's bytes (read once, then kept until clear()).
  const std::vector<char>& bytes(const SavedPiece& sp);
  // Reads the saved piece through a small buffer only to check its checksum (once per piece).
  void verify_only(const SavedPiece& sp);
  // The saved piece straight into `out` (its whole length).
  void read_into(const SavedPiece& sp, void* out);
  void clear() { cache_.clear(); }

 private:
  void verify(const SavedPiece& sp, const void* bytes) const;
  [[noreturn]] void fail(const SavedPiece& sp) const;
  const FileReader& file(int rank);
  const Manifest& m_;
  std::map<int, std::unique_ptr<FileReader>> readers_;
  std::map<std::pair<int, uint64_t>, std::vector<char>> cache_;
  std::set<std::pair<int, uint64_t>> verified_;
  std::vector<char> scratch_;
};

// Fills out[0, end - begin) (elements of `dtype`) with elements [begin, end) of kind `kind` of tensor
// `name`, from every saved piece that overlaps them (out == nullptr: only checks that they are all
// there and intact). Errors name `path` (the manifest).
void gather_range(const Manifest& m, PieceReader& reader, const std::string& name, const std::string& kind,
                  size_t begin, size_t end, void* out, DType dtype, const std::string& path);

}  // namespace zero
