// The engine's weights to and from one safetensors file: every rank writes (or reads) only the
// pieces it owns, in place, so no rank holds the whole model.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <sstream>

#include "base/check.h"
#include "base/error.h"
#include "memory/host_kernels.h"
#include "zero/checkpoint/checkpoint.h"
#include "zero/checkpoint/file_io.h"
#include "zero/checkpoint/safetensors.h"
#include "zero/rank_agreement.h"
#include "zero/tp_placement.h"

namespace zero {

namespace fs = std::filesystem;
using namespace checkpoint_internal;

namespace {

// The whole model's tensors in the file, and which of them (or of their tensor-parallel parts) this
// engine writes. Without model parallelism: every registered parameter, in registration order. With
// it: every engine's, in model-parallel rank order then registration order, each tensor (each tp
// part of a split one) written by the first engine that lists it (a tied weight once, a replicated
// one by tp rank 0).
struct ExportPlan {
  SafetensorsLayout layout;
  std::map<std::string, size_t> index;
  std::set<std::string> writes;  // registered names whose parts (or whole) this engine writes
};

ExportPlan plan_export(const CheckpointParts& p, DType dtype) {
  ExportPlan plan;
  // Each tensor this engine lists: its name, and "<tp part or -1 for the whole tensor> <whole shape>".
  std::vector<AgreementEntry> mine;
  for (const ParamSpec& spec : p.registry->params()) {
    const int part = spec.tp.is_split() && tp_size(p) > 1 ? tp_rank(p) : -1;
    if (part < 0 && tp_rank(p) != 0) continue;  // the same whole tensor as on tp rank 0
    mine.push_back({spec.name, fmt::format("{} {}", part, fmt::join(whole_shape(p, spec), ","))});
  }
  const std::vector<std::vector<AgreementEntry>> all =
      is_model_parallel(p) ? all_gather_entries(*p.model_parallel, p.device, mine, timeout_of(p))
                           : std::vector<std::vector<AgreementEntry>>{mine};
  const size_t me = is_model_parallel(p) ? static_cast<size_t>(p.model_parallel->rank()) : 0;
  std::set<std::pair<std::string, std::string>> listed;  // (name, part)
  for (size_t r = 0; r < all.size(); ++r) {
    for (const AgreementEntry& e : all[r]) {
      const size_t space = e.value.find(' ');
      if (!listed.insert({e.key, e.value.substr(0, space)}).second) continue;
      if (r == me) plan.writes.insert(e.key);
      if (plan.index.count(e.key)) continue;
      std::vector<int64_t> shape;
      std::stringstream dims(e.value.substr(space + 1));
      for (std::string d; std::getline(dims, d, ',');) shape.push_back(std::stoll(d));
      plan.index[e.key] = plan.layout.tensors.size();
      plan.layout.tensors.push_back({e.key, dtype, shape});
    }
  }
  return plan;
}

}  // namespace

void export_safetensors(const CheckpointParts& p, const std::string& path, DType dtype) {
  if (dtype != DType::kFloat32 && dtype != p.model_dtype) {
    ZERO_THROW(InvalidArgument, "export_safetensors('{}'): dtype {} must be fp32 or the model dtype {}", path,
               dtype_name(dtype), p.model_dtype ? dtype_name(*p.model_dtype) : "(none: the parameters mix dtypes)");
  }
  ExportPlan plan = plan_export(p, dtype);
  SafetensorsLayout& layout = plan.layout;
  const std::string header = safetensors_header(layout);
  const std::string tmp = path + ".tmp";
  const bool engine_leader = global_rank(p) == 0;
  const bool leader = engine_leader && (!is_model_parallel(p) || p.model_parallel->rank() == 0);
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
          auto write_at = [&](const char* bytes, size_t size, uint64_t at) {
            size_t done = 0;
            while (done < size) {
              const ssize_t w = ::pwrite(fd, bytes + done, size - done, static_cast<off_t>(at + done));
              if (w < 0 && errno == EINTR) continue;
              if (w < 0) ZERO_THROW(IoError, "'{}': write failed at byte {}: {}", tmp, at + done, std::strerror(errno));
              done += static_cast<size_t>(w);
            }
          };
          // `out` holding elements [begin, end) of this rank's tp part of `spec`, each run into its
          // place in the whole tensor.
          auto write_part = [&](const ParamSpec& spec, size_t begin, size_t end) {
            const SafetensorsTensor& t = layout.tensors[plan.index.at(spec.name)];
            for (const TpRun& run : part_runs(t.shape, spec.tp, tp_rank(p), tp_size(p), begin, end)) {
              write_at(out.data() + (run.local - begin) * es, run.n * es, layout.data_start + t.begin + run.full * es);
            }
          };
          for (const OwnedPiece& piece : p.ownership->pieces()) {
            const ParamSpec& spec = tensor_spec(p, piece.tensor);
            if (!writes(p, piece) || !plan.writes.count(spec.name)) continue;
            const size_t n = piece.tensor_end - piece.tensor_begin;
            master.resize(n);
            p.applier->read_master(piece.opt_offset, n, master.data());
            out.resize(n * es);
            memory::host_kernels::convert(master.data(), DType::kFloat32, out.data(), dtype, n);
            write_part(spec, piece.tensor_begin, piece.tensor_end);
          }
          // Frozen parameters, whole on every rank of an engine: its rank 0 writes them.
          if (engine_leader) {
            for (int id : frozen_ids(p)) {
              const ParamSpec& spec = p.registry->param(id);
              if (!plan.writes.count(spec.name)) continue;
              const std::vector<char> bytes = frozen_bytes(p, id);
              out.resize(p.registry->numel(id) * es);
              memory::host_kernels::convert(bytes.data(), spec.dtype, out.data(), dtype, p.registry->numel(id));
              write_part(spec, 0, p.registry->numel(id));
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
          // Elements [begin, end) of this rank's tp part of `spec` (tensor `t` of the file) into raw.
          auto read_part = [&](const ParamSpec& spec, const SafetensorsTensor& t, size_t begin, size_t end) {
            const size_t es = dtype_size(t.dtype);
            raw.resize((end - begin) * es);
            for (const TpRun& run : part_runs(t.shape, spec.tp, tp_rank(p), tp_size(p), begin, end)) {
              file.read(raw.data() + (run.local - begin) * es, run.n * es, layout.data_start + t.begin + run.full * es);
            }
          };
          // The file's tensor for a parameter, checked against it.
          auto find_tensor = [&](const ParamSpec& spec) -> const SafetensorsTensor& {
            const auto mapped = name_map.find(spec.name);
            const std::string& name = mapped == name_map.end() ? spec.name : mapped->second;
            const auto it = by_name.find(name);
            if (it == by_name.end()) {
              ZERO_THROW(InvalidArgument, "import '{}': no tensor '{}' (for parameter '{}')", path, name, spec.name);
            }
            const SafetensorsTensor& t = *it->second;
            if (t.shape != whole_shape(p, spec)) {
              ZERO_THROW(InvalidArgument, "import '{}': tensor '{}' has shape {} but parameter '{}' is {}", path, name,
                         shape_string(t.shape), spec.name, shape_string(whole_shape(p, spec)));
            }
            if (t.dtype != DType::kFloat32 && !is_float16_family(t.dtype)) {
              ZERO_THROW(InvalidArgument, "import '{}': tensor '{}' is {}, not a float type", path, name,
                         dtype_name(t.dtype));
            }
            return t;
          };
          for (const OwnedPiece& piece : p.ownership->pieces()) {
            const ParamSpec& spec = tensor_spec(p, piece.tensor);
            const SafetensorsTensor& t = find_tensor(spec);
            const size_t n = piece.tensor_end - piece.tensor_begin;
            read_part(spec, t, piece.tensor_begin, piece.tensor_end);
            memory::host_kernels::convert(raw.data(), t.dtype, master.data() + piece.opt_offset, DType::kFloat32, n);
          }
          // Frozen parameters, whole on every rank, in their own dtype.
          for (int id : frozen_ids(p)) {
            const ParamSpec& spec = p.registry->param(id);
            const SafetensorsTensor& t = find_tensor(spec);
            const size_t n = p.registry->numel(id);
            read_part(spec, t, 0, n);
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

}  // namespace zero
