// The engine's weights to and from one safetensors file: every rank writes (or reads) only the
// pieces it owns, in place, so no rank holds the whole model.
#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>

#include "base/check.h"
#include "base/error.h"
#include "memory/host_kernels.h"
#include "zero/checkpoint/checkpoint.h"
#include "zero/checkpoint/file_io.h"
#include "zero/checkpoint/safetensors.h"

namespace zero {

namespace fs = std::filesystem;
using namespace checkpoint_internal;

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

}  // namespace zero
