// The save: every rank's pieces into its data file and index, rank 0's manifest last, the directory
// swapped in (crash safety in checkpoint.h).
#include <chrono>
#include <filesystem>
#include <functional>
#include <thread>
#include <nlohmann/json.hpp>

#include "base/check.h"
#include "base/error.h"
#include "base/fault_injection.h"
#include "base/logging.h"
#include "layout/layout_json.h"
#include "memory/host_kernels.h"
#include "zero/checkpoint/checkpoint.h"
#include "zero/checkpoint/checkpoint_manifest.h"
#include "zero/checkpoint/crc32c.h"
#include "zero/checkpoint/file_io.h"
#include "zero/checkpoint/state_encoding.h"

namespace zero {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using namespace checkpoint_internal;

json scaler_json(const std::optional<optim::LossScalerState>& s) {
  if (!s) return nullptr;
  return {{"scale", s->scale},
          {"good_steps_since_growth", s->good_steps_since_growth},
          {"hysteresis_left", s->hysteresis_left},
          {"skipped_steps", s->skipped_steps},
          {"steps", s->steps}};
}

// One piece as the index describes it, and where its bytes are (valid during the sink's call).
struct PieceView {
  const std::string& name;
  const char* kind;
  size_t begin, end;
  DType dtype;
  const void* bytes;
  size_t n;
  const StateEncoding* encoding = nullptr;  // an optimizer state's piece stored encoded; else none
};

// A piece of an async save's staging: its bytes are staging[offset, offset + n).
struct StagedPiece {
  std::string name, kind;
  size_t begin = 0, end = 0;
  DType dtype = DType::kFloat32;
  uint64_t offset = 0, n = 0;
  StateEncoding encoding;
};

// State `name`'s piece of n values at optimizer-space element `at`, stored as the optimizer's
// encoding says, or else as one value where all are the same bits (the zeros a state reads for the
// elements of another kind of optimizer), into `encoded` and `e`; false where neither decodes back
// to every value's bits (an 8-bit optimizer's tensors kept in fp32, say): then the piece goes fp32.
bool encode(ShardOptimizer& opt, const std::string& name, size_t at, const float* values, size_t n,
            std::vector<float>& scales, std::vector<char>& encoded, StateEncoding& e) {
  e = opt.state_encoding(name, at, n);
  if (e.kind == StateEncoding::Kind::kDynamic8) {
    scales.resize(n);
    opt.read_state(e.scale_state, at, n, scales.data());
  }
  if (e.kind != StateEncoding::Kind::kNone && encode_state(e, values, scales.data(), n, encoded)) return true;
  e = uniform_encoding(n);
  return n > 1 && encode_state(e, values, nullptr, n, encoded);
}

// Hands each of this rank's pieces to `sink`, straight from the engine's memory where the master and
// the state are host memory in fp32, else through a copy.
template <typename Sink>
void for_each_piece(const CheckpointParts& p, std::string_view blob, Sink&& sink) {
  const std::vector<std::string> states = state_names(p);
  const float* host_master = p.applier->host_master();
  ShardOptimizer& opt = shard_optimizer(p);
  std::vector<const float*> host_states;
  for (const std::string& st : states) host_states.push_back(opt.host_state(st));
  StateEncoding encoding;
  std::vector<float> master, state, scales;
  std::vector<char> params, encoded;
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
    sink(PieceView{name, kCheckpointMasterKind, piece.tensor_begin, piece.tensor_end, DType::kFloat32, m, n * sizeof(float)});
    for (size_t s = 0; s < states.size(); ++s) {
      const float* v = host_states[s] ? host_states[s] + piece.opt_offset : nullptr;
      if (v == nullptr) {
        state.resize(n);
        opt.read_state(states[s], piece.opt_offset, n, state.data());
        v = state.data();
      }
      const std::string kind = checkpoint_state_kind(states[s]);
      if (encode(opt, states[s], piece.opt_offset, v, n, scales, encoded, encoding)) {
        sink(PieceView{name, kind.c_str(), piece.tensor_begin, piece.tensor_end, DType::kFloat32, encoded.data(),
                       encoded.size(), &encoding});
        continue;
      }
      sink(PieceView{name, kind.c_str(), piece.tensor_begin, piece.tensor_end, DType::kFloat32, v, n * sizeof(float)});
    }
    // The parameters are the master rounded to their registered dtype (what every step writes).
    const DType dt = tensor_spec(p, piece.tensor).dtype;
    const void* w = m;
    if (dt != DType::kFloat32) {
      params.resize(n * dtype_size(dt));
      memory::host_kernels::convert(m, DType::kFloat32, params.data(), dt, n);
      w = params.data();
    }
    sink(PieceView{name, kCheckpointParamsKind, piece.tensor_begin, piece.tensor_end, dt, w, n * dtype_size(dt)});
  }
  // Frozen parameters are whole on every rank: rank 0 writes them.
  if (global_rank(p) == 0) {
    for (int id : frozen_ids(p)) {
      const ParamSpec& spec = p.registry->param(id);
      if (!saves(p, spec)) continue;
      const std::vector<char> bytes = frozen_bytes(p, id);
      sink(PieceView{spec.name, kCheckpointFrozenKind, 0, p.registry->numel(id), spec.dtype, bytes.data(), bytes.size()});
    }
  }
  static const std::string none;
  sink(PieceView{none, kCheckpointBlobKind, 0, blob.size(), DType::kUInt8, blob.data(), blob.size()});
}

// Rank `rank`'s data file and index in `dir`, piece by piece. Each piece's bytes are checksummed
// once; the file's checksum is combined from the pieces'.
class RankFiles {
 public:
  RankFiles(int rank, std::string dir)
      : rank_(rank), dir_(std::move(dir)), data_(dir_ + "/" + checkpoint_rank_file(rank, "bin"), FileWriter::Mode::kDirect) {}
  // A piece from the engine's memory.
  void add(const PieceView& v) {
    index(v.name, v.kind, v.begin, v.end, v.dtype, data_.bytes(), v.n, crc32c(v.bytes, v.n), v.encoding);
    data_.write(v.bytes, v.n);
  }
  // Staged pieces, which are the staging's bytes in file order: then the staging is written whole.
  void add_staged(const std::vector<StagedPiece>& pieces, const SaveStaging& staging) {
    ZERO_CHECK(data_.bytes() == 0, "staged pieces start the file");
    for (const StagedPiece& sp : pieces) {
      uint32_t crc = 0;
      staging.for_each_span(sp.offset, sp.n, [&](const char* bytes, size_t n) { crc = crc32c(bytes, n, crc); });
      index(sp.name, sp.kind.c_str(), sp.begin, sp.end, sp.dtype, sp.offset, sp.n, crc, &sp.encoding);
    }
    staging.for_each_span(0, staging.size(), [&](const char* bytes, size_t n) { data_.write(bytes, n); });
  }
  void commit() {
    ZERO_CHECK(indexed_ == data_.bytes(), "the index covers the data file");
    fault::point("checkpoint_write");  // the data is written, not yet synced, renamed or indexed
    data_.commit();
    const json index = {{"rank", rank_}, {"file", checkpoint_rank_file(rank_, "bin")}, {"bytes", data_.bytes()},
                        {"crc32c", file_crc_}, {"pieces", pieces_}};
    const std::string text = index.dump(1);
    FileWriter idx(dir_ + "/" + checkpoint_rank_file(rank_, "json"));
    idx.write(text.data(), text.size());
    idx.commit();
  }

 private:
  void index(const std::string& name, const char* kind, size_t begin, size_t end, DType dtype, uint64_t offset,
             uint64_t n, uint32_t crc, const StateEncoding* encoding) {
    ZERO_CHECK(offset == indexed_, "pieces are back to back");
    json piece = {{"name", name}, {"kind", kind}, {"begin", begin}, {"end", end}, {"dtype", dtype_name(dtype)},
                  {"offset", offset}, {"bytes", n}, {"crc32c", crc}};
    if (encoding != nullptr && encoding->kind != StateEncoding::Kind::kNone) {
      json e = {{"kind", state_encoding_name(encoding->kind)}, {"block", encoding->block}};
      if (encoding->kind == StateEncoding::Kind::kDynamic8) e["map"] = encoding->is_signed ? "signed" : "unsigned";
      if (encoding->phase != 0) e["phase"] = encoding->phase;
      piece["encoding"] = std::move(e);
    }
    pieces_.push_back(std::move(piece));
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

// Every parameter this engine saves, in registration order (the export's order): the whole
// tensor's shape, and for a tensor-parallel part which one it is.
json params_json(const CheckpointParts& p) {
  json params = json::array();
  for (const ParamSpec& spec : p.registry->params()) {
    if (!saves(p, spec)) continue;
    json j = {{"name", spec.name}, {"shape", whole_shape(p, spec)}, {"dtype", dtype_name(spec.dtype)},
              {"trainable", spec.requires_grad}};
    if (spec.tp.is_split() && tp_size(p) > 1) {
      j["tp"] = {{"parts", tp_size(p)}, {"part", tp_rank(p)}, {"dim", spec.tp.dim}, {"blocks", spec.tp.blocks}};
    }
    params.push_back(std::move(j));
  }
  return params;
}

// The layout the checkpoint was saved at (zero_ckpt inspect shows it; a load needs none of it).
// The run's layout with what the engine itself knows written over it (the sizes of its groups, its
// stage and offload); without a run layout, those fields alone.
json saved_layout_json(const CheckpointParts& p) {
  const int mp = is_model_parallel(p) ? p.model_parallel->size() : 1;
  Layout l = p.run_layout ? *p.run_layout : Layout{};
  l.dp = world_size(p);
  l.shard = p.replica ? p.shard->size() : 0;
  l.tp = tp_size(p);
  l.pp = mp / tp_size(p);
  l.stage = p.options->stage;
  l.offload_optimizer = p.options->offload.optimizer;
  l.offload_params = p.options->offload.params;
  json j = json::parse(layout_json(l, LayoutFields::kAll).dump());
  if (p.run_layout == nullptr) {
    for (const char* unknown : {"order", "micro_batches", "schedule", "chunks", "sequence_parallel", "recompute"}) {
      j.erase(unknown);
    }
  }
  return j;
}

// Everything of the manifest but the file list, taken when the save starts.
json manifest_head(const CheckpointParts& p, const CheckpointState& state) {
  json options = json::object();
  for (const auto& [k, v] : fingerprint(*p.options)) options[k] = v;
  return {{"format", kCheckpointFormat},
          {"version", kCheckpointVersion},
          {"step", state.step},
          {"world_size", world_size(p)},
          {"stage", p.options->stage},
          {"layout", saved_layout_json(p)},
          {"model_dtype", p.model_dtype ? dtype_name(*p.model_dtype) : kCheckpointMixedDtypes},
          {"optimizer", {{"kind", optim::optimizer_label(p.options->optimizer)}, {"states", state_names(p)}}},
          {"loss_scaler", scaler_json(state.scaler)},
          {"params", params_json(p)},
          {"options", options}};
}

// Rank 0, once every rank's index is in `dir`: the manifest, last.
void write_manifest(json manifest, int world, const std::string& dir) {
  json files = json::array();
  for (int r = 0; r < world; ++r) {
    const std::string text = read_whole_file(dir + "/" + checkpoint_rank_file(r, "json"));
    const json index = json::parse(text);
    files.push_back({{"rank", r}, {"file", index["file"]}, {"bytes", index["bytes"]}, {"crc32c", index["crc32c"]},
                     {"index", checkpoint_rank_file(r, "json")}, {"index_crc32c", crc32c(text.data(), text.size())}});
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
      if (path_exists(dir + "/" + checkpoint_rank_file(r, "json"))) break;
      const std::string failed = dir + "/" + checkpoint_rank_file(r, "failed");
      if (path_exists(failed)) ZERO_THROW(IoError, "rank {} could not write its part: {}", r, read_whole_file(failed));
      if (std::chrono::steady_clock::now() > deadline) {
        ZERO_THROW(TimeoutError, "checkpoint '{}': rank {} did not write its part within {} ms", dir, r, timeout.count());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
}

// A model-parallel checkpoint's top manifest: the step, the layout and the part directories, one per
// engine (model-parallel rank).
std::string top_manifest_text(const CheckpointParts& p, const CheckpointState& state) {
  json parts = json::array();
  for (int r = 0; r < p.model_parallel->size(); ++r) parts.push_back(checkpoint_part_dir(r));
  const json top = {{"format", kCheckpointFormat}, {"version", kCheckpointVersion}, {"step", state.step},
                    {"layout", saved_layout_json(p)}, {"parts", parts}};
  return top.dump(1);
}

// The top manifest's writer: waits until every part is complete in DIR.partial (its manifest there,
// which each engine's swap puts in last), writes the top manifest and swaps DIR.partial in. Run by the
// save's own thread, so that a model-parallel save completes on its own like any other, and a run
// killed before its next save still has it.
void complete_top(const std::string& top, const std::string& text, int parts, std::chrono::milliseconds timeout) {
  const std::string partial = top + ".partial";
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (int r = 0; r < parts; ++r) {
    const std::string part = partial + "/" + checkpoint_part_dir(r);
    while (!path_exists(part + "/manifest.json")) {
      // A rank of that part that could not write leaves a note in the part's own DIR.partial.
      std::error_code ec;
      for (const auto& f : fs::directory_iterator(part + ".partial", ec)) {
        if (f.path().extension() == ".failed") {
          ZERO_THROW(IoError, "checkpoint '{}': part {} could not be written: {}", top, r, read_whole_file(f.path().string()));
        }
      }
      if (std::chrono::steady_clock::now() > deadline) {
        ZERO_THROW(TimeoutError, "checkpoint '{}': part {} ('{}') was not complete within {} ms", top, r, part,
                   timeout.count());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
  }
  FileWriter m(partial + "/manifest.json");
  m.write(text.data(), text.size());
  m.commit();
  sync_directory(partial);
  swap_in_directory(partial, top);
}

// InvalidArgument unless `copies` fits the engine: its ranks, rank for rank, and one engine (no
// model parallelism).
void check_node_copies(const CheckpointParts& p, const NodeCopies& copies) {
  if (is_model_parallel(p)) {
    ZERO_THROW(InvalidArgument, "a checkpoint with node copies holds one engine's state; this engine is one of {} "
               "(tensor or pipeline parallelism): save to a directory all ranks see",
               p.model_parallel->size());
  }
  const int world = world_size(p), rank = global_rank(p);
  ZERO_CHECK(copies.comm != nullptr, "NodeCopies without a communicator");
  if (copies.comm->size() != world || copies.comm->rank() != rank ||
      copies.node_of_rank.size() != static_cast<size_t>(world)) {
    ZERO_THROW(InvalidArgument, "NodeCopies: its communicator is rank {} of {} with {} nodes listed, but the engine is "
               "rank {} of {}: it must hold the engine's ranks, rank for rank",
               copies.comm->rank(), copies.comm->size(), copies.node_of_rank.size(), rank, world);
  }
}

}  // namespace

struct PendingSave::Job {
  // A model-parallel save: the checkpoint's directory, which this engine's part `dir` is under, and
  // whether this rank writes its top manifest. Empty otherwise.
  std::string top;
  bool top_leader = false;
  std::string top_text;  // the top leader's: its top manifest
  int parts = 0;
  CheckpointState state;
  std::string dir;
  int rank = 0, world = 1;
  std::chrono::milliseconds timeout{};
  SaveStaging* staging = nullptr;  // background saves
  const NodeCopies* copies = nullptr;  // a save into each node's own directory (node_copies.h)
  bool completes = false;  // writes the manifest and swaps the directory in: rank 0, or each node's first rank
  std::vector<StagedPiece> staged;
  json manifest;
  std::string error;
  std::thread thread;
};

PendingSave::PendingSave(const CheckpointParts& p, const CheckpointState& state, const std::string& dir,
                         std::string_view user_blob, SaveStaging* staging, const NodeCopies* copies)
    : job_(std::make_unique<Job>()) {
  Job& j = *job_;
  j.staging = staging;
  const bool background = staging != nullptr;
  j.rank = global_rank(p);
  j.world = world_size(p);
  j.timeout = timeout_of(p);
  j.state = state;
  j.dir = dir;
  j.copies = copies;
  j.completes = j.rank == 0;
  if (copies != nullptr) {
    check_node_copies(p, *copies);
    j.completes = node_leader(copies->node_of_rank, j.rank) == j.rank;
  }
  if (is_model_parallel(p)) {
    // Each engine saves its part into DIR.partial/part-<model-parallel rank>; DIR.partial is swapped
    // in whole once every part is there (wait()). Its leader prepares it first.
    j.top = dir;
    j.dir = dir + ".partial/" + checkpoint_part_dir(p.model_parallel->rank());
    j.top_leader = j.rank == 0 && p.model_parallel->rank() == 0;
    j.parts = p.model_parallel->size();
    if (j.top_leader) j.top_text = top_manifest_text(p, state);
    agree(p, "checkpoint save", attempt([&] {
            if (!j.top_leader) return;
            fs::remove_all(dir + ".partial");
            fs::create_directories(dir + ".partial");
          }));
  }
  const std::string partial = j.dir + ".partial";
  // Rank 0 (with node copies: each node's first rank) prepares an empty DIR.partial (a leftover of an
  // interrupted save is discarded); every rank copies its pieces out of the engine. From here on
  // nothing of the engine is touched.
  agree(p, "checkpoint save", attempt([&] {
          if (j.completes) {
            fs::remove_all(partial);
            fs::create_directories(partial);
            j.manifest = manifest_head(p, state);
          }
          if (background) {
            staging->clear();
            for_each_piece(p, user_blob, [&](const PieceView& v) {
              j.staged.push_back({v.name, v.kind, v.begin, v.end, v.dtype, staging->append(v.bytes, v.n), v.n,
                                  v.encoding != nullptr ? *v.encoding : StateEncoding{}});
            });
          }
        }));
  // In the background the snapshot is written; inline, each piece goes to the file as it is copied
  // out of the engine (only then may `fill` touch the engine).
  auto work = [&j, partial](const std::function<void(RankFiles&)>& fill) {
    j.error = attempt([&] {
      const std::string own = attempt([&] {
        RankFiles files(j.rank, partial);
        fill(files);
        files.commit();
      });
      j.staged.clear();
      if (!own.empty() && j.copies == nullptr) {
        // Rank 0 stops waiting for this rank as soon as it sees the note.
        FileWriter f(partial + "/" + checkpoint_rank_file(j.rank, "failed"));
        f.write(own.data(), own.size());
        f.commit();
      }
      // With node copies the ranks learn of each other's failures there (and throw all alike).
      if (j.copies != nullptr) exchange_node_copies(*j.copies, partial, own, j.timeout);
      if (!own.empty()) throw IoError(own);
      if (!j.completes) return;
      wait_for_ranks(j.world, partial, j.timeout);
      write_manifest(std::move(j.manifest), j.world, partial);
      swap_in_directory(partial, j.dir);
      if (j.top_leader) complete_top(j.top, j.top_text, j.parts, j.timeout);
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
  // Every rank learns whether any part (or the top manifest) failed.
  agree(p, "checkpoint save", error);
  ZERO_LOG_INFO("checkpoint saved to '{}' ({} ranks)", job_->dir, job_->world);
}

void save_checkpoint(const CheckpointParts& p, const CheckpointState& state, const std::string& dir,
                     std::string_view user_blob) {
  PendingSave(p, state, dir, user_blob, nullptr, nullptr).wait(p);
}

}  // namespace zero
