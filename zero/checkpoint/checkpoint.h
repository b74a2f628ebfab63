#pragma once
// Checkpointer: save and load of the rank's (parameter, element range) pieces, at any world size and
// stage; export of the full weights as safetensors. The format ("Checkpoint format" in docs/design.md,
// docs/checkpoints.md): a directory with, per writing rank, a data file rank-NNNNN.bin (the pieces
// back to back: fp32 master, each optimizer state in fp32, the parameters in the model dtype, the
// rank's user blob, and on rank 0 the frozen parameters whole) and an index rank-NNNNN.json (each piece's tensor name, kind, element range,
// offset, bytes and CRC-32C; the file's size and CRC-32C), and manifest.json, written last (format,
// step, world size, stage, model dtype, optimizer, loss scaler, the parameters' names, shapes and
// dtypes, the options fingerprint, every rank file with its size and checksum). No flat offsets and
// nothing that depends on the layout: a load intersects the ranges each rank now owns with the saved
// pieces and reads only those pieces.
//
// Crash safety: a save writes into DIR.partial (each file under a temporary name, fsynced, renamed),
// the manifest last, and only then swaps DIR.partial into DIR (the previous checkpoint there moves to
// DIR.old until the swap is done, then is removed). A directory without manifest.json is never
// loaded.
//
// Every rank validates what it reads (the manifest against the registration, sizes, every piece's
// checksum, in a first pass that writes nothing) before anything in the engine changes, and the
// ranks agree on the outcome: a bad checkpoint fails on every rank with an error naming the file and
// the problem, and leaves every engine as it was. A second pass then reads the pieces into place.
//
// The files by job: checkpoint_save.cc, checkpoint_load.cc, checkpoint_safetensors.cc (the engine's
// weights to and from one safetensors file); checkpoint_reader.h reads a directory back and
// checkpoint_offline.h looks into one without an engine.
#include <map>
#include <memory>
#include <string>
#include <vector>
#include <string_view>

#include "zero/checkpoint/checkpoint_parts.h"
#include "zero/checkpoint/checkpoint_types.h"
#include "zero/checkpoint/node_copies.h"
#include "zero/checkpoint/save_staging.h"

namespace zero {

// A save in progress. The constructor is collective: rank 0 prepares DIR.partial and, given a
// staging, every rank copies its pieces (master, state, parameters, blob) into it; the files are
// then written from the staging on a thread of this object, which uses the staging until wait() or
// destruction. Without a staging the files are written from the engine's memory before the
// constructor returns. Rank 0
// writes the manifest and swaps the directory in once every rank's index is there (a rank that fails
// leaves a note, so rank 0 never waits for it past the note). wait() is collective: it returns when
// the checkpoint is complete on disk, and every rank raises the same error if any rank's part failed.
class PendingSave {
 public:
  // `copies`: each node saves into its own `dir`, with copies of its ranks' data files on other
  // nodes (zero/checkpoint/node_copies.h); nullptr: `dir` is one directory every rank sees.
  PendingSave(const CheckpointParts& parts, const CheckpointState& state, const std::string& dir,
              std::string_view user_blob, SaveStaging* staging, const NodeCopies* copies = nullptr);
  ~PendingSave();  // joins the writer (an unreported failure is logged)
  PendingSave(const PendingSave&) = delete;
  PendingSave& operator=(const PendingSave&) = delete;
  void wait(const CheckpointParts& parts);
  bool written() const;  // this rank's writer has finished (no wait needed to free it)

 private:
  struct Job;
  std::unique_ptr<Job> job_;
};

// Collective over every rank: a PendingSave written before it returns, then waited for. `user_blob`:
// this rank's opaque bytes (RNG, data position).
void save_checkpoint(const CheckpointParts& parts, const CheckpointState& state, const std::string& dir,
                     std::string_view user_blob);

// Collective. Writes the master, the optimizer state and (through the writeback) the parameters;
// the caller applies `state` (step count, loss scaler). Throws before changing anything when the
// checkpoint is missing, incomplete, corrupt or of another model.
// `options` says what to do with the optimizer state where the checkpoint's optimizer differs.
LoadedCheckpoint load_checkpoint(const CheckpointParts& parts, const std::string& dir, const LoadOptions& options = {});
// The same from several directories that together hold the model (a pipeline's stages, each saved by
// its own engine): each registered parameter is read from the first directory that holds it (a
// weight two stages tie is in both, equal); parameters no directory holds fail as above, ones this
// engine does not register are another engine's. The step must agree; the user blobs, the saved
// world size and stage are the first directory's.
LoadedCheckpoint load_checkpoint(const CheckpointParts& parts, const std::vector<std::string>& dirs,
                                 const LoadOptions& options = {});

// Collective: the full weights as one safetensors file, fp32 (the master) or the model dtype, in
// registration order; every rank writes the pieces it owns in place, so no rank holds the model.
void export_safetensors(const CheckpointParts& parts, const std::string& path, DType dtype);

// Collective: the parameters (and the fp32 master) from a safetensors file, each rank reading only
// the ranges it owns; `name_map` maps registered names to the file's where they differ. Shapes must
// match; F32, F16 and BF16 are widened exactly. The optimizer state is left as it is. Throws naming
// the file and the tensor, on every rank, before anything changes.
void import_safetensors(const CheckpointParts& parts, const std::string& path,
                        const std::map<std::string, std::string>& name_map);

}  // namespace zero
