#include "zero/checkpoint/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include <algorithm>
#include <cstring>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <nlohmann/json.hpp>

#include "base/check.h"
#include "base/fault_injection.h"
#include "base/logging.h"
#include "memory/host_kernels.h"
#include "zero/checkpoint/checkpoint_manifest.h"
#include "zero/checkpoint/crc32c.h"
#include "zero/checkpoint/file_io.h"
#include "zero/checkpoint/safetensors.h"
#include "zero/rank_agreement.h"

namespace zero {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kFormat = kCheckpointFormat;
constexpr int kVersion = kCheckpointVersion;
constexpr const char* kMaster = "master";
constexpr const char* kParams = "params";
constexpr const char* kBlob = kCheckpointBlobKind;
constexpr const char* kFrozen = "frozen";  // a frozen parameter, whole, in its own dtype

std::string state_kind(const std::string& name) { return "state:" + name; }
std::string rank_name(int r, const char* ext) { return fmt::format("rank-{:05d}.{}", r, ext); }

int global_rank(const CheckpointParts& p) {
  return p.replica ? p.replica->rank() * p.shard->size() + p.shard->rank() : p.shard->rank();
}
int world_size(const CheckpointParts& p) { return p.shard->size() * (p.replica ? p.replica->size() : 1); }
std::chrono::milliseconds timeout_of(const CheckpointParts& p) { return p.options->timeout; }

const std::string& tensor_name(const CheckpointParts& p, size_t t) {
  return p.registry->param((*p.tensor_param)[t]).name;
}

std::vector<int> frozen_ids(const CheckpointParts& p) {
  std::vector<int> ids;
  for (size_t i = 0; i < p.registry->params().size(); ++i) {
    if (!p.registry->params()[i].requires_grad) ids.push_back(static_cast<int>(i));
  }
  return ids;
}

// A frozen parameter's values (the user's storage, on the engine's device) copied to the host.
std::vector<char> frozen_bytes(const CheckpointParts& p, int id) {
  const ParamSpec& spec = p.registry->param(id);
  std::vector<char> out(p.registry->numel(id) * dtype_size(spec.dtype));
  memory::Stream& compute = p.device->compute_stream();
  p.device->copy(out.data(), spec.data.ptr, out.size(), compute);
  p.device->synchronize(compute, timeout_of(p));
  return out;
}

void set_frozen(const CheckpointParts& p, int id, const std::vector<char>& bytes) {
  memory::Stream& compute = p.device->compute_stream();
  p.device->copy(p.registry->param(id).data.ptr, bytes.data(), bytes.size(), compute);
  p.device->synchronize(compute, timeout_of(p));
}

// Replicas hold the same pieces: the first replica writes them. Replicated ownership (stage 0): every
// rank owns everything, so the buckets are dealt out round robin.
bool writes(const CheckpointParts& p, const OwnedPiece& piece) {
  if (p.replica && p.replica->rank() != 0) return false;
  if (p.ownership->is_replicated()) return static_cast<int>(piece.bucket % p.shard->size()) == p.shard->rank();
  return true;
}

// Collective over every rank: each rank's error (or "") becomes the same exception everywhere.
void agree(const CheckpointParts& p, const std::string& what, std::string error) {
  const AgreementSubject subject{what, "has"};
  try {
    check_agreement(*p.shard, subject, {}, error, timeout_of(p), p.device);
  } catch (const InvalidArgument& e) {
    error = e.what();
  }
  if (p.replica) {
    try {
      check_agreement(*p.replica, subject, {}, error, timeout_of(p), p.device);
    } catch (const InvalidArgument& e) {
      error = e.what();
    }
  }
  if (!error.empty()) throw IoError(error);
}

// Runs `fn` and returns its error message ("" on success), so that a rank's failure can be agreed on.
template <typename Fn>
std::string attempt(Fn&& fn) {
  try {
    fn();
    return {};
  } catch (const std::exception& e) {
    return e.what();
  }
}

std::vector<std::string> state_names(const CheckpointParts& p) { return p.applier->optimizer().state_names(); }

ShardOptimizer& shard_optimizer(const CheckpointParts& p) { return p.applier->optimizer(); }

json scaler_json(const std::optional<optim::LossScalerState>& s) {
  if (!s) return nullptr;
  return {{"scale", s->scale},
          {"good_steps_since_growth", s->good_steps_since_growth},
          {"hysteresis_left", s->hysteresis_left},
          {"skipped_steps", s->skipped_steps},
          {"steps", s->steps}};
}

// --- save ----------------------------------------------------------------------------------------

// One piece as the index describes it, and where its bytes are (valid during the sink's call).
struct PieceView {
  const std::string& name;
  const char* kind;
  size_t begin, end;
  DType dtype;
  const void* bytes;
  size_t n;
};

// A piece of an async save's staging: its bytes are staging[offset, offset + n).
struct StagedPiece {
  std::string name, kind;
  size_t begin = 0, end = 0;
  DType dtype = DType::kFloat32;
  uint64_t offset = 0, n = 0;
};

// Hands each of this rank's pieces to `sink`, straight from the engine's memory where the master and
// the state are host memory in fp32, else through a copy.
template <typename Sink>
void for_each_piece(const CheckpointParts& p, std::string_view blob, Sink&& sink) {
  const std::vector<std::string> states = state_names(p);
  const float* host_master = p.applier->host_master();
  ShardOptimizer& opt = shard_optimizer(p);
  std::vector<const float*> host_states;
  for (const std::string& st : states) host_states.push_back(opt.host_state(st));
  std::vector<float> master, state;
  std::vector<char> params;
  for (const OwnedPiece& piece : p.ownership->pieces()) {
    if (!writes(p, piece)) continue;
    const size_t n = piece.tensor_end - piece.tensor_begin;
    const std::string& name = tensor_name(p, piece.tensor);
    const float* m = host_master ? host_master + piece.opt_offset : nullptr;
    if (m == nullptr) {
      master.resize(n);
      p.applier->read_master(piece.opt_offset, n, master.data());
      m = master.data();
    }
    sink(PieceView{name, kMaster, piece.tensor_begin, piece.tensor_end, DType::kFloat32, m, n * sizeof(float)});
    for (size_t s = 0; s < states.size(); ++s) {
      const float* v = host_states[s] ? host_states[s] + piece.opt_offset : nullptr;
      if (v == nullptr) {
        state.resize(n);
        opt.read_state(states[s], piece.opt_offset, n, state.data());
        v = state.data();
      }
      const std::string kind = state_kind(states[s]);
      sink(PieceView{name, kind.c_str(), piece.tensor_begin, piece.tensor_end, DType::kFloat32, v, n * sizeof(float)});
    }
    // The parameters are the master rounded to the model dtype (what every step writes).
    const void* w = m;
    if (p.model_dtype != DType::kFloat32) {
      params.resize(n * dtype_size(p.model_dtype));
      memory::host_kernels::convert(m, DType::kFloat32, params.data(), p.model_dtype, n);
      w = params.data();
    }
    sink(PieceView{name, kParams, piece.tensor_begin, piece.tensor_end, p.model_dtype, w, n * dtype_size(p.model_dtype)});
  }
  // Frozen parameters are whole on every rank: rank 0 writes them.
  if (global_rank(p) == 0) {
    for (int id : frozen_ids(p)) {
      const ParamSpec& spec = p.registry->param(id);
      const std::vector<char> bytes = frozen_bytes(p, id);
      sink(PieceView{spec.name, kFrozen, 0, p.registry->numel(id), spec.dtype, bytes.data(), bytes.size()});
    }
  }
  static const std::string none;
  sink(PieceView{none, kBlob, 0, blob.size(), DType::kUInt8, blob.data(), blob.size()});
}

// Rank `rank`'s data file and index in `dir`, piece by piece. Each piece's bytes are checksummed
// once; the file's checksum is combined from the pieces'.
class RankFiles {
 public:
  RankFiles(int rank, std::string dir)
      : rank_(rank), dir_(std::move(dir)), data_(dir_ + "/" + rank_name(rank, "bin"), FileWriter::Mode::kDirect) {}
  // A piece from the engine's memory.
  void add(const PieceView& v) {
    index(v.name, v.kind, v.begin, v.end, v.dtype, data_.bytes(), v.n, crc32c(v.bytes, v.n));
    data_.write(v.bytes, v.n);
  }
  // Staged pieces, which are the staging's bytes in file order: then the staging is written whole.
  void add_staged(const std::vector<StagedPiece>& pieces, const SaveStaging& staging) {
    ZERO_CHECK(data_.bytes() == 0, "staged pieces start the file");
    for (const StagedPiece& sp : pieces) {
      uint32_t crc = 0;
      staging.for_each_span(sp.offset, sp.n, [&](const char* bytes, size_t n) { crc = crc32c(bytes, n, crc); });
      index(sp.name, sp.kind.c_str(), sp.begin, sp.end, sp.dtype, sp.offset, sp.n, crc);
    }
    staging.for_each_span(0, staging.size(), [&](const char* bytes, size_t n) { data_.write(bytes, n); });
  }
  void commit() {
    ZERO_CHECK(indexed_ == data_.bytes(), "the index covers the data file");
    fault::point("checkpoint_write");  // the data is written, not yet synced, renamed or indexed
    data_.commit();
    const json index = {{"rank", rank_}, {"file", rank_name(rank_, "bin")}, {"bytes", data_.bytes()},
                        {"crc32c", file_crc_}, {"pieces", pieces_}};
    const std::string text = index.dump(1);
    FileWriter idx(dir_ + "/" + rank_name(rank_, "json"));
    idx.write(text.data(), text.size());
    idx.commit();
  }

 private:
  void index(const std::string& name, const char* kind, size_t begin, size_t end, DType dtype, uint64_t offset,
             uint64_t n, uint32_t crc) {
    ZERO_CHECK(offset == indexed_, "pieces are back to back");
    pieces_.push_back({{"name", name}, {"kind", kind}, {"begin", begin}, {"end", end}, {"dtype", dtype_name(dtype)},
                       {"offset", offset}, {"bytes", n}, {"crc32c", crc}});
    file_crc_ = crc32c_combine(file_crc_, crc, n);
    indexed_ += n;
  }
  int rank_;
  std::string dir_;
  FileWriter data_;
  json pieces_ = json::array();
  uint32_t file_crc_ = 0;
  uint64_t indexed_ = 0;
};

// Every registered parameter, in registration order (the export's order).
json params_json(const CheckpointParts& p) {
  json params = json::array();
  for (const ParamSpec& spec : p.registry->params()) {
    params.push_back({{"name", spec.name}, {"shape", spec.shape}, {"dtype", dtype_name(spec.dtype)},
                      {"trainable", spec.requires_grad}});
  }
  return params;
}

// Everything of the manifest but the file list, taken when the save starts.
json manifest_head(const CheckpointParts& p, const CheckpointState& state) {
  json options = json::object();
  for (const auto& [k, v] : fingerprint(*p.options)) options[k] = v;
  return {{"format", kFormat},
          {"version", kVersion},
          {"step", state.step},
          {"world_size", world_size(p)},
          {"stage", p.options->stage},
          {"model_dtype", dtype_name(p.model_dtype)},
          {"optimizer", {{"kind", optim::optimizer_name(p.options->optimizer.kind)}, {"states", state_names(p)}}},
          {"loss_scaler", scaler_json(state.scaler)},
          {"params", params_json(p)},
          {"options", options}};
}

// Rank 0, once every rank's index is in `dir`: the manifest, last.
void write_manifest(json manifest, int world, const std::string& dir) {
  json files = json::array();
  for (int r = 0; r < world; ++r) {
    const std::string text = read_whole_file(dir + "/" + rank_name(r, "json"));
    const json index = json::parse(text);
    files.push_back({{"rank", r}, {"file", index["file"]}, {"bytes", index["bytes"]}, {"crc32c", index["crc32c"]},
                     {"index", rank_name(r, "json")}, {"index_crc32c", crc32c(text.data(), text.size())}});
  }
  manifest["files"] = files;
  const std::string text = manifest.dump(1);
  FileWriter m(dir + "/manifest.json");
  m.write(text.data(), text.size());
  m.commit();
  sync_directory(dir);
}

// Rank 0: waits until every rank's index (or failure note) is in `dir`.
void wait_for_ranks(int world, const std::string& dir, std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int r = 0; r < world; ++r) {
    for (;;) {
      if (path_exists(dir + "/" + rank_name(r, "json"))) break;
      const std::string failed = dir + "/" + rank_name(r, "failed");
      if (path_exists(failed)) ZERO_THROW(IoError, "rank {} could not write its part: {}", r, read_whole_file(failed));
      if (std::chrono::steady_clock::now() > deadline) {
        ZERO_THROW(TimeoutError, "checkpoint '{}': rank {} did not write its part within {} ms", dir, r, timeout.count());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
}

// --- load ----------------------------------------------------------------------------------------

// The text of the manifest and the indexes is parsed in zero/checkpoint_manifest; these keep the
// short names this file has always used.
[[noreturn]] void bad(const std::string& where, const std::string& what) { checkpoint_error(where, what); }

template <typename T>
T field(const json& j, const char* key, const std::string& where) {
  return checkpoint_field<T>(j, key, where);
}

Manifest read_manifest(const std::string& dir) {
  const std::string path = dir + "/manifest.json";
  if (!path_exists(path)) {
    std::string hint;
    if (path_exists(dir + ".partial")) hint = fmt::format("; '{}.partial' is a save still running or interrupted", dir);
    if (path_exists(dir + ".old")) hint += fmt::format("; '{}.old' holds the previous complete checkpoint", dir);
    bad(dir, (path_exists(dir) ? "no manifest.json: not a complete checkpoint" : "no such directory") + hint);
  }
  Manifest m = parse_manifest(read_whole_file(path), path);
  const json files = field<json>(m.doc, "files", path);
  for (size_t r = 0; r < files.size(); ++r) {
    const json& f = files[r];
    const std::string index_path = dir + "/" + field<std::string>(f, "index", path);
    if (!path_exists(index_path)) bad(index_path, fmt::format("missing (the index of rank {})", r));
    const std::string text = read_whole_file(index_path);
    if (crc32c(text.data(), text.size()) != field<uint32_t>(f, "index_crc32c", path)) {
      bad(index_path, "checksum mismatch: the index was changed or damaged after the save");
    }
    const json index = parse_checkpoint_json(text, index_path);
    const std::string data_path = dir + "/" + field<std::string>(f, "file", path);
    if (!path_exists(data_path)) bad(data_path, fmt::format("missing (the data of rank {})", r));
    struct stat st {};
    ::stat(data_path.c_str(), &st);
    if (static_cast<uint64_t>(st.st_size) != field<uint64_t>(f, "bytes", path)) {
      bad(data_path, fmt::format("{} bytes, the manifest says {}: the file is truncated or was replaced",
                                 static_cast<uint64_t>(st.st_size), field<uint64_t>(f, "bytes", path)));
    }
    m.files.push_back(data_path);
    add_index_pieces(index, index_path, static_cast<int>(r), static_cast<uint64_t>(st.st_size), m);
  }
  return m;
}

// The manifest against this engine's registration and optimizer: names, shapes, dtypes, states.
void check_model(const CheckpointParts& p, const Manifest& m, const std::string& path) {
  std::map<std::string, json> saved;
  for (const json& j : field<json>(m.doc, "params", path)) saved[field<std::string>(j, "name", path)] = j;
  for (const ParamSpec& spec : p.registry->params()) {
    const auto it = saved.find(spec.name);
    if (it == saved.end()) bad(path, fmt::format("has no parameter '{}' (a checkpoint of another model?)", spec.name));
    const auto shape = field<std::vector<int64_t>>(it->second, "shape", path);
    if (shape != spec.shape) {
      bad(path, fmt::format("parameter '{}' has shape {} but the engine registered {}", spec.name, shape_string(shape),
                            shape_string(spec.shape)));
    }
    if (field<std::string>(it->second, "dtype", path) != dtype_name(spec.dtype)) {
      bad(path, fmt::format("parameter '{}' was saved as {} but the engine registered {}", spec.name,
                            field<std::string>(it->second, "dtype", path), dtype_name(spec.dtype)));
    }
    if (field<bool>(it->second, "trainable", path) != spec.requires_grad) {
      bad(path, fmt::format("parameter '{}' was saved {} but the engine registered it {}", spec.name,
                            spec.requires_grad ? "frozen" : "trainable", spec.requires_grad ? "trainable" : "frozen"));
    }
    saved.erase(it);
  }
  if (!saved.empty()) {
    bad(path, fmt::format("holds parameter '{}', which the engine did not register (a checkpoint of another model?)",
                          saved.begin()->first));
  }
  const json opt = field<json>(m.doc, "optimizer", path);
  const std::string kind = field<std::string>(opt, "kind", path);
  if (kind != optim::optimizer_name(p.options->optimizer.kind)) {
    bad(path, fmt::format("saved by optimizer {} but the engine runs {}", kind,
                          optim::optimizer_name(p.options->optimizer.kind)));
  }
}

// One kind of one owned piece, read from every saved piece that overlaps it.
struct Overlap {
  const SavedPiece* saved;
  size_t begin, end;  // tensor elements
};

class PieceReader {
 public:
  explicit PieceReader(const Manifest& m) : m_(m) {}
  // The saved piece's bytes, checksum verified (read once).
  const std::vector<char>& bytes(const SavedPiece& sp) {
    const auto key = std::make_pair(sp.file, sp.offset);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    std::vector<char> buf(sp.bytes);
    file(sp.file).read(buf.data(), buf.size(), sp.offset);
    verify(sp, buf.data());
    return cache_.emplace(key, std::move(buf)).first->second;
  }
  // Reads the saved piece through a small buffer only to check its checksum (once per piece).
  void verify_only(const SavedPiece& sp) {
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
  // The saved piece straight into `out` (its whole length), checksum verified.
  void read_into(const SavedPiece& sp, void* out) {
    file(sp.file).read(out, sp.bytes, sp.offset);
    verify(sp, out);
  }
  void clear() { cache_.clear(); }

 private:
  void verify(const SavedPiece& sp, const void* bytes) const {
    if (crc32c(bytes, sp.bytes) != sp.crc) fail(sp);
  }
  [[noreturn]] void fail(const SavedPiece& sp) const {
    bad(m_.files[static_cast<size_t>(sp.file)],
        fmt::format("checksum mismatch in piece {} [{}, {}) at byte {}: the file is damaged", sp.kind, sp.begin, sp.end,
                    sp.offset));
  }
  const FileReader& file(int r) {
    auto it = readers_.find(r);
    if (it == readers_.end()) it = readers_.emplace(r, std::make_unique<FileReader>(m_.files[static_cast<size_t>(r)])).first;
    return *it->second;
  }
  const Manifest& m_;
  std::map<int, std::unique_ptr<FileReader>> readers_;
  std::map<std::pair<int, uint64_t>, std::vector<char>> cache_;
  std::set<std::pair<int, uint64_t>> verified_;
  std::vector<char> scratch_;
};

// Fills out[0, end - begin) (elements of `dtype`) with elements [begin, end) of kind `kind` of tensor
// `name`, from every saved piece that overlaps them (out == nullptr: only checks that they are all
// there and intact).
void gather_range(const Manifest& m, PieceReader& reader, const std::string& name, const std::string& kind,
                  size_t begin, size_t end, void* out, DType dtype, const std::string& path) {
  size_t covered = 0;
  const size_t es = dtype_size(dtype);
  const auto it = m.pieces.find(name);
  if (it != m.pieces.end()) {
    for (const SavedPiece& sp : it->second) {
      if (sp.kind != kind || sp.end <= begin || sp.begin >= end) continue;
      if (sp.dtype != dtype) {
        bad(path, fmt::format("piece {} of '{}' is {}, not {}", kind, name, dtype_name(sp.dtype), dtype_name(dtype)));
      }
      const size_t lo = std::max(begin, sp.begin), hi = std::min(end, sp.end);
      if (out == nullptr) {
        reader.verify_only(sp);
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
    bad(path, fmt::format("holds {} of the {} elements [{}, {}) of '{}' ({}) this rank needs", covered, end - begin,
                          begin, end, name, kind));
  }
}

}  // namespace

struct PendingSave::Job {
  std::string dir;
  int rank = 0, world = 1;
  std::chrono::milliseconds timeout{};
  SaveStaging* staging = nullptr;  // background saves
  std::vector<StagedPiece> staged;
  json manifest;
  std::string error;
  std::thread thread;
};

PendingSave::PendingSave(const CheckpointParts& p, const CheckpointState& state, const std::string& dir,
                         std::string_view user_blob, SaveStaging* staging)
    : job_(std::make_unique<Job>()) {
  Job& j = *job_;
  j.staging = staging;
  const bool background = staging != nullptr;
  j.dir = dir;
  j.rank = global_rank(p);
  j.world = world_size(p);
  j.timeout = timeout_of(p);
  const std::string partial = dir + ".partial";
  // Rank 0 prepares an empty DIR.partial (a leftover of an interrupted save is discarded); every rank
  // copies its pieces out of the engine. From here on nothing of the engine is touched.
  agree(p, "checkpoint save", attempt([&] {
          if (j.rank == 0) {
            fs::remove_all(partial);
            fs::create_directories(partial);
            j.manifest = manifest_head(p, state);
          }
          if (background) {
            staging->clear();
            for_each_piece(p, user_blob, [&](const PieceView& v) {
              j.staged.push_back({v.name, v.kind, v.begin, v.end, v.dtype, staging->append(v.bytes, v.n), v.n});
            });
          }
        }));
  // In the background the snapshot is written; inline, each piece goes to the file as it is copied
  // out of the engine (only then may `fill` touch the engine).
  auto work = [&j, partial](const std::function<void(RankFiles&)>& fill) {
    j.error = attempt([&] {
      try {
        RankFiles files(j.rank, partial);
        fill(files);
        files.commit();
      } catch (const std::exception& e) {
        // Rank 0 stops waiting for this rank as soon as it sees the note.
        const std::string note = e.what();
        FileWriter f(partial + "/" + rank_name(j.rank, "failed"));
        f.write(note.data(), note.size());
        f.commit();
        throw;
      }
      j.staged.clear();
      if (j.rank != 0) return;
      wait_for_ranks(j.world, partial, j.timeout);
      write_manifest(std::move(j.manifest), j.world, partial);
      // The swap: the previous checkpoint stays whole in DIR.old until DIR holds the new one.
      const std::string old = j.dir + ".old";
      fs::remove_all(old);
      if (fs::exists(j.dir)) fs::rename(j.dir, old);
      fs::rename(partial, j.dir);
      sync_directory(fs::absolute(fs::path(j.dir)).parent_path().string());
      fs::remove_all(old);
    });
  };
  if (background) {
    j.thread = std::thread([&j, work] {
      work([&j](RankFiles& files) { files.add_staged(j.staged, *j.staging); });
    });
  } else {
    work([&](RankFiles& files) { for_each_piece(p, user_blob, [&](const PieceView& v) { files.add(v); }); });
  }
}

PendingSave::~PendingSave() {
  if (job_ && job_->thread.joinable()) job_->thread.join();
  if (job_ && !job_->error.empty()) ZERO_LOG_ERROR("checkpoint save to '{}' failed: {}", job_->dir, job_->error);
}

bool PendingSave::written() const { return !job_->thread.joinable(); }

void PendingSave::wait(const CheckpointParts& p) {
  if (job_->thread.joinable()) job_->thread.join();
  std::string error = std::exchange(job_->error, {});
  agree(p, "checkpoint save", error);
  ZERO_LOG_INFO("checkpoint saved to '{}' ({} ranks)", job_->dir, job_->world);
}

void save_checkpoint(const CheckpointParts& p, const CheckpointState& state, const std::string& dir,
                     std::string_view user_blob) {
  PendingSave(p, state, dir, user_blob, nullptr).wait(p);
}

LoadedCheckpoint load_checkpoint(const CheckpointParts& p, const std::string& dir) {
  LoadedCheckpoint out;
  std::optional<Manifest> m;
  std::vector<std::string> names;
  // Where the master and the state are, when the host can write them in place (fp32 state): then the
  // first pass only checks and the second reads straight into them; otherwise the first pass reads
  // into buffers, written into the engine once every rank agreed.
  float* direct_master = p.applier->host_master();
  const size_t numel = p.ownership->numel();
  std::unique_ptr<float[]> master;  // uninitialized: every element is written (coverage is checked)
  std::vector<std::unique_ptr<float[]>> states;
  std::vector<float*> direct_states;
  std::vector<std::vector<char>> frozen;  // by frozen_ids order
  const std::string path = dir + "/manifest.json";
  // Pass 1: read and verify everything this rank needs before anything changes.
  agree(p, "checkpoint load", attempt([&] {
          m = read_manifest(dir);
          check_model(p, *m, path);
          names = state_names(p);
          const auto saved_states = field<std::vector<std::string>>(field<json>(m->doc, "optimizer", path), "states", path);
          for (const std::string& s : names) {
            if (std::find(saved_states.begin(), saved_states.end(), s) == saved_states.end()) {
              bad(path, fmt::format("has no optimizer state '{}'", s));
            }
          }
          for (const std::string& s : names) {
            direct_states.push_back(shard_optimizer(p).host_state(s));
            if (direct_states.back() == nullptr) direct_master = nullptr;
          }
          if (direct_master == nullptr) {
            master.reset(new float[numel]);
            for (size_t i = 0; i < names.size(); ++i) states.emplace_back(new float[numel]);
          }
          PieceReader reader(*m);
          for (const OwnedPiece& piece : p.ownership->pieces()) {
            const std::string& name = tensor_name(p, piece.tensor);
            gather_range(*m, reader, name, kMaster, piece.tensor_begin, piece.tensor_end,
                         master ? master.get() + piece.opt_offset : nullptr, DType::kFloat32, path);
            for (size_t s = 0; s < names.size(); ++s) {
              gather_range(*m, reader, name, state_kind(names[s]), piece.tensor_begin, piece.tensor_end,
                           master ? states[s].get() + piece.opt_offset : nullptr, DType::kFloat32, path);
            }
            reader.clear();
          }
          for (int id : frozen_ids(p)) {
            const ParamSpec& spec = p.registry->param(id);
            std::vector<char>& bytes = frozen.emplace_back(p.registry->numel(id) * dtype_size(spec.dtype));
            gather_range(*m, reader, spec.name, kFrozen, 0, p.registry->numel(id), bytes.data(), spec.dtype, path);
          }
          for (const SavedPiece& b : m->blobs) {
            const std::vector<char>& bytes = reader.bytes(b);
            if (out.user_blobs.size() <= static_cast<size_t>(b.file)) out.user_blobs.resize(static_cast<size_t>(b.file) + 1);
            out.user_blobs[static_cast<size_t>(b.file)].assign(bytes.begin(), bytes.end());
          }
          out.world_size = field<int>(m->doc, "world_size", path);
          out.stage = field<int>(m->doc, "stage", path);
          out.state.step = field<int64_t>(m->doc, "step", path);
          const json& sc = m->doc["loss_scaler"];
          if (!sc.is_null()) {
            optim::LossScalerState st;
            st.scale = field<float>(sc, "scale", path);
            st.good_steps_since_growth = field<int64_t>(sc, "good_steps_since_growth", path);
            st.hysteresis_left = field<int>(sc, "hysteresis_left", path);
            st.skipped_steps = field<int64_t>(sc, "skipped_steps", path);
            st.steps = field<int64_t>(sc, "steps", path);
            out.state.scaler = st;
          }
        }));
  // Pass 2, everything verified on every rank: into the engine.
  if (direct_master != nullptr) {
    // The same pieces again (now from the page cache, their checksums checked again) straight into
    // place. Only a file changed between the passes can fail here, and it is reported.
    PieceReader reader(*m);
    for (const OwnedPiece& piece : p.ownership->pieces()) {
      const std::string& name = tensor_name(p, piece.tensor);
      gather_range(*m, reader, name, kMaster, piece.tensor_begin, piece.tensor_end, direct_master + piece.opt_offset,
                   DType::kFloat32, path);
      for (size_t s = 0; s < names.size(); ++s) {
        gather_range(*m, reader, name, state_kind(names[s]), piece.tensor_begin, piece.tensor_end,
                     direct_states[s] + piece.opt_offset, DType::kFloat32, path);
      }
      reader.clear();
    }
  } else {
    for (const OwnedPiece& piece : p.ownership->pieces()) {
      const size_t n = piece.tensor_end - piece.tensor_begin;
      p.applier->write_master(piece.opt_offset, n, master.get() + piece.opt_offset);
      for (size_t s = 0; s < names.size(); ++s) {
        shard_optimizer(p).write_state(names[s], piece.opt_offset, n, states[s].get() + piece.opt_offset);
      }
    }
  }
  const std::vector<int> frozen_list = frozen_ids(p);
  for (size_t i = 0; i < frozen_list.size(); ++i) set_frozen(p, frozen_list[i], frozen[i]);
  p.applier->publish_master(*p.writeback);
  return out;
}

void export_safetensors(const CheckpointParts& p, const std::string& path, DType dtype) {
  if (dtype != DType::kFloat32 && dtype != p.model_dtype) {
    ZERO_THROW(InvalidArgument, "export_safetensors('{}'): dtype {} must be fp32 or the model dtype {}", path,
               dtype_name(dtype), dtype_name(p.model_dtype));
  }
  // Every registered parameter, in registration order, frozen ones included.
  SafetensorsLayout layout;
  std::map<std::string, size_t> index;
  for (const ParamSpec& spec : p.registry->params()) {
    index[spec.name] = layout.tensors.size();
    layout.tensors.push_back({spec.name, dtype, spec.shape});
  }
  const std::string header = safetensors_header(layout);
  const std::string tmp = path + ".tmp";
  const bool leader = global_rank(p) == 0;
  agree(p, "safetensors export", attempt([&] {
          if (!leader) return;
          FileWriter f(path + ".head");  // written, then grown to the full size
          f.write(header.data(), header.size());
          f.commit();
          fs::rename(path + ".head", tmp);
          fs::resize_file(tmp, layout.file_bytes());
        }));
  agree(p, "safetensors export", attempt([&] {
          const int fd = ::open(tmp.c_str(), O_WRONLY | O_CLOEXEC);
          if (fd < 0) ZERO_THROW(IoError, "'{}': cannot open for writing: {}", tmp, std::strerror(errno));
          struct Closer {
            int fd;
            ~Closer() { ::close(fd); }
          } closer{fd};
          std::vector<float> master;
          std::vector<char> out;
          const size_t es = dtype_size(dtype);
          auto write_at = [&](uint64_t at) {
            size_t done = 0;
            while (done < out.size()) {
              const ssize_t w = ::pwrite(fd, out.data() + done, out.size() - done, static_cast<off_t>(at + done));
              if (w < 0 && errno == EINTR) continue;
              if (w < 0) ZERO_THROW(IoError, "'{}': write failed at byte {}: {}", tmp, at + done, std::strerror(errno));
              done += static_cast<size_t>(w);
            }
          };
          for (const OwnedPiece& piece : p.ownership->pieces()) {
            if (!writes(p, piece)) continue;
            const size_t n = piece.tensor_end - piece.tensor_begin;
            master.resize(n);
            p.applier->read_master(piece.opt_offset, n, master.data());
            out.resize(n * es);
            memory::host_kernels::convert(master.data(), DType::kFloat32, out.data(), dtype, n);
            const SafetensorsTensor& t = layout.tensors[index.at(tensor_name(p, piece.tensor))];
            write_at(layout.data_start + t.begin + piece.tensor_begin * es);
          }
          // Frozen parameters, whole on every rank: rank 0 writes them.
          if (leader) {
            for (int id : frozen_ids(p)) {
              const ParamSpec& spec = p.registry->param(id);
              const std::vector<char> bytes = frozen_bytes(p, id);
              out.resize(p.registry->numel(id) * es);
              memory::host_kernels::convert(bytes.data(), spec.dtype, out.data(), dtype, p.registry->numel(id));
              write_at(layout.data_start + layout.tensors[index.at(spec.name)].begin);
            }
          }
          if (::fsync(fd) != 0) ZERO_THROW(IoError, "'{}': fsync failed: {}", tmp, std::strerror(errno));
        }));
  agree(p, "safetensors export", attempt([&] {
          if (leader) fs::rename(tmp, path);
        }));
}

void import_safetensors(const CheckpointParts& p, const std::string& path,
                        const std::map<std::string, std::string>& name_map) {
  std::vector<float> master(p.ownership->numel());
  std::vector<std::vector<char>> frozen;  // by frozen_ids order
  agree(p, "safetensors import", attempt([&] {
          const SafetensorsLayout layout = read_safetensors_header(path);
          std::map<std::string, const SafetensorsTensor*> by_name;
          for (const SafetensorsTensor& t : layout.tensors) by_name[t.name] = &t;
          for (const auto& [engine_name, file_name] : name_map) {
            if (!p.registry->find(engine_name)) {
              ZERO_THROW(InvalidArgument, "import '{}': the name map's '{}' is not a registered parameter", path,
                         engine_name);
            }
            (void)file_name;
          }
          const FileReader file(path);
          std::vector<char> raw;
          // The file's tensor for a parameter, checked against it.
          auto find_tensor = [&](const ParamSpec& spec) -> const SafetensorsTensor& {
            const auto mapped = name_map.find(spec.name);
            const std::string& name = mapped == name_map.end() ? spec.name : mapped->second;
            const auto it = by_name.find(name);
            if (it == by_name.end()) {
              ZERO_THROW(InvalidArgument, "import '{}': no tensor '{}' (for parameter '{}')", path, name, spec.name);
            }
            const SafetensorsTensor& t = *it->second;
            if (t.shape != spec.shape) {
              ZERO_THROW(InvalidArgument, "import '{}': tensor '{}' has shape {} but parameter '{}' is {}", path, name,
                         shape_string(t.shape), spec.name, shape_string(spec.shape));
            }
            if (t.dtype != DType::kFloat32 && !is_float16_family(t.dtype)) {
              ZERO_THROW(InvalidArgument, "import '{}': tensor '{}' is {}, not a float type", path, name,
                         dtype_name(t.dtype));
            }
            return t;
          };
          for (const OwnedPiece& piece : p.ownership->pieces()) {
            const ParamSpec& spec = p.registry->param((*p.tensor_param)[piece.tensor]);
            const SafetensorsTensor& t = find_tensor(spec);
            const size_t es = dtype_size(t.dtype), n = piece.tensor_end - piece.tensor_begin;
            raw.resize(n * es);
            file.read(raw.data(), raw.size(), layout.data_start + t.begin + piece.tensor_begin * es);
            memory::host_kernels::convert(raw.data(), t.dtype, master.data() + piece.opt_offset, DType::kFloat32, n);
          }
          // Frozen parameters, whole on every rank, in their own dtype.
          for (int id : frozen_ids(p)) {
            const ParamSpec& spec = p.registry->param(id);
            const SafetensorsTensor& t = find_tensor(spec);
            const size_t n = p.registry->numel(id);
            raw.resize(n * dtype_size(t.dtype));
            file.read(raw.data(), raw.size(), layout.data_start + t.begin);
            std::vector<char>& bytes = frozen.emplace_back(n * dtype_size(spec.dtype));
            memory::host_kernels::convert(raw.data(), t.dtype, bytes.data(), spec.dtype, n);
          }
        }));
  for (const OwnedPiece& piece : p.ownership->pieces()) {
    p.applier->write_master(piece.opt_offset, piece.tensor_end - piece.tensor_begin, master.data() + piece.opt_offset);
  }
  const std::vector<int> frozen_list = frozen_ids(p);
  for (size_t i = 0; i < frozen_list.size(); ++i) set_frozen(p, frozen_list[i], frozen[i]);
  p.applier->publish_master(*p.writeback);
}

namespace {

CheckpointInfo info_of(const Manifest& m, const std::string& path) {
  CheckpointInfo info;
  info.step = field<int64_t>(m.doc, "step", path);
  info.world_size = field<int>(m.doc, "world_size", path);
  info.stage = field<int>(m.doc, "stage", path);
  info.model_dtype = parse_dtype(field<std::string>(m.doc, "model_dtype", path));
  const json opt = field<json>(m.doc, "optimizer", path);
  info.optimizer = field<std::string>(opt, "kind", path);
  info.states = field<std::vector<std::string>>(opt, "states", path);
  for (const json& j : field<json>(m.doc, "params", path)) {
    info.params.push_back({field<std::string>(j, "name", path), field<std::vector<int64_t>>(j, "shape", path),
                           parse_dtype(field<std::string>(j, "dtype", path)), field<bool>(j, "trainable", path)});
  }
  for (size_t r = 0; r < m.files.size(); ++r) {
    info.files.push_back({m.files[r], field<uint64_t>(m.doc["files"][r], "bytes", path)});
  }
  return info;
}

}  // namespace

CheckpointInfo inspect_checkpoint(const std::string& dir) { return info_of(read_manifest(dir), dir + "/manifest.json"); }

void verify_checkpoint(const std::string& dir) {
  const Manifest m = read_manifest(dir);
  const std::string path = dir + "/manifest.json";
  std::vector<char> buf(size_t{4} << 20);
  for (size_t r = 0; r < m.files.size(); ++r) {
    const FileReader f(m.files[r]);
    uint32_t crc = 0;
    for (uint64_t at = 0; at < f.size(); at += buf.size()) {
      const size_t n = static_cast<size_t>(std::min<uint64_t>(buf.size(), f.size() - at));
      f.read(buf.data(), n, at);
      crc = crc32c(buf.data(), n, crc);
    }
    if (crc == field<uint32_t>(m.doc["files"][r], "crc32c", path)) continue;
    // A damaged file: its pieces' own checksums name the piece (the index itself was verified).
    PieceReader reader(m);
    for (const auto& [name, pieces] : m.pieces) {
      for (const SavedPiece& sp : pieces) {
        if (sp.file == static_cast<int>(r)) reader.verify_only(sp);
      }
    }
    for (const SavedPiece& sp : m.blobs) {
      if (sp.file == static_cast<int>(r)) reader.verify_only(sp);
    }
    bad(m.files[r], "checksum mismatch: the file is damaged");
  }
}

void export_checkpoint(const std::string& dir, const std::string& out, DType dtype) {
  const Manifest m = read_manifest(dir);
  const std::string path = dir + "/manifest.json";
  const CheckpointInfo info = info_of(m, path);
  // fp32 comes from the master; the model dtype from the saved parameters.
  const bool from_params = dtype != DType::kFloat32;
  if (from_params && dtype != info.model_dtype) {
    bad(path, fmt::format("export as {}: the checkpoint holds fp32 masters and {} parameters", dtype_name(dtype),
                          dtype_name(info.model_dtype)));
  }
  SafetensorsLayout layout;
  for (const CheckpointInfo::Param& p : info.params) layout.tensors.push_back({p.name, dtype, p.shape});
  const std::string header = safetensors_header(layout);
  FileWriter f(out, FileWriter::Mode::kDirect);
  f.write(header.data(), header.size());
  PieceReader reader(m);
  std::vector<char> tensor;
  // One tensor in memory at a time; layout.tensors[i] is info.params[i].
  for (size_t i = 0; i < layout.tensors.size(); ++i) {
    const SafetensorsTensor& t = layout.tensors[i];
    const CheckpointInfo::Param& param = info.params[i];
    const size_t n = static_cast<size_t>((t.end - t.begin) / dtype_size(dtype));
    tensor.resize(t.end - t.begin);
    if (param.trainable) {
      gather_range(m, reader, t.name, from_params ? kParams : kMaster, 0, n, tensor.data(), dtype, path);
    } else {
      // Frozen: saved whole in its own dtype.
      std::vector<char> saved(n * dtype_size(param.dtype));
      gather_range(m, reader, t.name, kFrozen, 0, n, saved.data(), param.dtype, path);
      memory::host_kernels::convert(saved.data(), param.dtype, tensor.data(), dtype, n);
    }
    reader.clear();
    f.write(tensor.data(), tensor.size());
  }
  f.commit();
}

}  // namespace zero
