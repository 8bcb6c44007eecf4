#pragma once
/// Sharded checkpoints: a directory with one file per rank, each holding that rank's pieces of
/// the parameters and optimizer state, plus metadata.json; written atomically, and read back
/// whole or cut into the pieces of another world size. Only files here: the sharding engine calls
/// these functions and runs the barriers between them.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <ATen/core/Tensor.h>

#include <lockstep/checkpoint/checkpoint_io.h>

namespace lockstep {
namespace checkpoint {

/// The elements [begin, begin + values.numel()) of a tensor of `shape`, counted in its flattened
/// (row-major) order. `values` is 1-D; it may be empty, and it may be a view into a larger
/// buffer (write_shard saves only its own elements).
struct TensorPiece {
  std::vector<int64_t> shape;
  int64_t begin = 0;
  at::Tensor values;
};

/// One rank's part of a sharded checkpoint.
///   common: what every rank holds alike (epoch, global_step, loop state, the optimizers'
///           param_groups and scalar state such as Adam's step); only rank 0's is saved.
///   pieces: by key, a path of '/'-separated names that says where the full tensor belongs in
///           the full checkpoint: "state_dict/fc1.weight", "optimizer_states/0/state/3/exp_avg"
///           (see to_full_checkpoint). Every rank has a piece of every key, empty (values of
///           0 elements) where it holds none of the tensor, and over all ranks the pieces of a
///           key cover its tensor exactly once.
struct ShardedCheckpoint {
  Checkpoint common = make_checkpoint();
  std::map<std::string, TensorPiece> pieces;
};

/// A range of a key's flattened elements: [begin, begin + numel).
struct PieceRange {
  int64_t begin = 0;
  int64_t numel = 0;
};

/// What metadata.json says about one key: the full tensor's shape and dtype, and each rank's
/// range (numel 0 for a rank without elements of it).
struct ShardedTensorInfo {
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::kFloat;
  std::vector<PieceRange> ranks;
};

/// metadata.json of a sharded checkpoint.
struct ShardedMetadata {
  int version = 1;
  int world_size = 1;
  std::map<std::string, ShardedTensorInfo> tensors;
};

/// A sharded checkpoint put back together: rank 0's common dict and every key's full tensor in
/// its shape.
struct ReassembledCheckpoint {
  Checkpoint common = make_checkpoint();
  std::map<std::string, at::Tensor> tensors;
};

// --- writing ---------------------------------------------------------------------------------
// A sharded checkpoint is the directory `final_dir`:
//   rank_<r>.ckpt   one per rank, written by CheckpointIO (torch.load reads it as a dict:
//                   format, version, rank, world_size, common (rank 0 only; {} elsewhere),
//                   pieces: {key: {"shape": [...], "begin": b, "values": 1-D tensor}})
//   metadata.json   {"format": "lockstep sharded checkpoint", "version": 1, "world_size": N,
//                    "tensors": {key: {"shape": [...], "dtype": "Float",
//                                      "ranks": [{"begin": b, "numel": n}, ...one per rank]}}}
// Saving, on every rank (the directory must be on a filesystem that all ranks share):
//   const auto tmp = begin_sharded_save(dir, rank);     // rank 0 prepares "<dir>.tmp"
//   barrier();
//   write_shard(tmp, rank, world_size, shard);
//   barrier();
//   if (rank == 0) commit_sharded_save(tmp, dir, world_size);
//   barrier();                                           // before anyone reads `dir`
// The files are written under "<dir>.tmp" and appear under `dir` all at once, by one rename,
// with metadata.json already in place: a process killed at any moment leaves either the previous
// checkpoint at `dir` or the new one, complete, never a part. The next begin_sharded_save removes
// what an interrupted save left behind.

/// The temporary directory of a save to `final_dir` ("<final_dir>.tmp", the same on every rank).
/// On rank 0 it also removes what an interrupted save left there, restores a checkpoint that an
/// interrupted commit had moved aside ("<final_dir>.old", on filesystems without an atomic
/// exchange of directories), and creates the directory empty. Other ranks only get the name.
/// Throws IoError if a directory cannot be removed or created.
std::string begin_sharded_save(const std::string& final_dir, int rank);

/// Writes rank `rank`'s part into `tmp_dir`: rank_<rank>.ckpt (atomically, fsync'ed) and a small
/// index that commit_sharded_save reads. Pieces on a GPU are copied to the CPU, and a piece that
/// is a view into a larger buffer is saved without the rest of it. Throws UsageError for a rank
/// outside [0, world_size), a piece whose values are not 1-D or lie outside its shape (naming the
/// key), and IoError for a file that cannot be written.
void write_shard(const std::string& tmp_dir, int rank, int world_size, const ShardedCheckpoint& shard);

/// On rank 0, once every rank's write_shard has returned: checks that every rank's file is there
/// and that the pieces of every key agree on shape and dtype and cover it exactly once, writes
/// metadata.json, and moves `tmp_dir` to `final_dir` in one rename, replacing a checkpoint of that
/// name only now (the parent directory is fsync'ed). Throws UsageError naming the key or the rank
/// for pieces that overlap, leave a gap or disagree, a key that a rank has no piece of, and a
/// rank that wrote nothing; the previous checkpoint at `final_dir` is then left as it was.
void commit_sharded_save(const std::string& tmp_dir, const std::string& final_dir, int world_size);

// --- reading ---------------------------------------------------------------------------------

/// True when `path` is a directory with a metadata.json (a complete sharded checkpoint, as far as
/// its name goes); a checkpoint file or a missing path is false.
bool is_sharded_checkpoint(const std::string& path);

/// Reads and checks metadata.json of the sharded checkpoint `dir`. Throws UsageError naming the
/// path, what is wrong and the fix for a missing directory or metadata.json, a damaged or foreign
/// one, an unknown version, pieces that do not cover a tensor exactly once, and a rank_<r>.ckpt
/// beyond its world size (files of two saves mixed).
ShardedMetadata read_sharded_metadata(const std::string& dir);

/// Reads the whole sharded checkpoint `dir`: rank 0's common dict and every key's full tensor
/// (on the CPU, in its shape and dtype). Rank files are read one at a time. Throws UsageError
/// naming the file and the fix for everything read_sharded_metadata refuses, a missing or damaged
/// rank file, a rank file of another save (its rank or world size differs from metadata.json) and
/// pieces that differ from the metadata.
ReassembledCheckpoint load_sharded(const std::string& dir);

/// Reads only what a rank needs to resume with another layout (or the same one): for each key of
/// `wanted`, the piece [begin, begin + numel) of its full tensor, copied from the rank files that
/// hold those elements, without building any full tensor; and rank 0's common dict. Only rank 0's
/// file and the files that overlap `wanted` are read. Throws UsageError as load_sharded does, and
/// for a wanted key the checkpoint lacks or a range outside its tensor (naming both).
///   auto mine = load_sharded_pieces(dir, {{"state_dict/fc1.weight", {begin, numel}}, ...});
ShardedCheckpoint load_sharded_pieces(const std::string& dir, const std::map<std::string, PieceRange>& wanted);

/// The pieces of full tensors: for each key of `wanted`, elements [begin, begin + numel) of
/// `full.at(key)` flattened (a copy, 1-D). Throws UsageError for a key that `full` lacks or a
/// range outside its tensor.
std::map<std::string, TensorPiece> cut_pieces(const std::map<std::string, at::Tensor>& full,
                                              const std::map<std::string, PieceRange>& wanted);

// --- the full checkpoint ------------------------------------------------------------------------

/// One checkpoint dict, as a one-process or DDP run saves it, from `common` and the full tensors:
/// each key's tensor is put at its path in a copy of `common` (which is left as it was). At each
/// '/'-separated name the path goes into a list by index (index == size appends a dict), or into
/// a dict: by the name as a string key when the dict holds it, else a decimal name is an int key
/// (Python numbers optimizer state by int), else a string key; levels that are missing become
/// dicts. So "state_dict/fc1.weight" lands in ckpt["state_dict"]["fc1.weight"] and
/// "optimizer_states/0/state/3/exp_avg" in ckpt["optimizer_states"][0]["state"][3]["exp_avg"],
/// the layout of optimizer_state.h, beside the "step" that `common` holds there. Throws
/// UsageError naming the key when its path runs into a tensor or another non-container, or
/// would replace a dict or a list.
///   CheckpointIO().save(to_full_checkpoint(load_sharded(dir)), "full.ckpt");  // torch.load reads it
Checkpoint to_full_checkpoint(const Checkpoint& common, const std::map<std::string, at::Tensor>& tensors);

/// The same, for what load_sharded returns.
Checkpoint to_full_checkpoint(const ReassembledCheckpoint& checkpoint);

}  // namespace checkpoint
}  // namespace lockstep
