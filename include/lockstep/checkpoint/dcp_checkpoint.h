#pragma once
/// Sharded checkpoints in torch.distributed.checkpoint's (DCP's) default on-disk format, as
/// PyTorch's FileSystemWriter writes them: a folder with `.metadata` (a pickle of DCP's Metadata)
/// and one `__<rank>_0.distcp` file per rank, each tensor chunk and each Python value in it a
/// torch.save archive at an offset. Python's `dcp.load` reads what Lockstep writes, and Lockstep
/// reads what `dcp.save` wrote, on any world size and sharding on either side.
///
/// Keys, between DCP (the flattened names of `dcp.save({"model": model_sd, "optim": optim_sd})`
/// with `get_state_dict(model, optimizer)`) and Lockstep's sharded checkpoint (sharded_checkpoint.h;
/// `k` is the parameter's index in the optimizer, as Python numbers it across its param_groups):
///   model.<fqn>                  tensor  <->  piece  state_dict/<fqn>
///   <fqn> (no "model." on any)   tensor  ->   piece  state_dict/<fqn>        (read only)
///   optim.state.<fqn>.<name>     tensor  <->  piece  optimizer_states/0/state/<k>/<name>
///   optim.state.<fqn>.step       0-dim   <->  common optimizer_states[0]["state"][k]["step"]
///   optim.param_groups.<g>.<opt> bytes   <->  common optimizer_states[0]["param_groups"][g][opt]
///                                             ("params": fqns there, indices k here)
///   <name> (any other)           bytes   <->  common[<name>] (epoch, global_step, loops, ...)
/// docs/user-guide.md ("Checkpoints in PyTorch's DCP format") has the same table.

#include <map>
#include <string>
#include <vector>

#include <lockstep/checkpoint/sharded_checkpoint.h>

namespace lockstep {
namespace checkpoint {

// --- writing (every rank, as write_shard; the directory comes from begin_sharded_save) ---------
//   const auto tmp = begin_sharded_save(dir, rank);
//   barrier();
//   write_dcp_shard(tmp, rank, world_size, shard, names);
//   barrier();
//   if (rank == 0) commit_dcp_save(tmp, dir, world_size);
//   barrier();

/// Writes rank `rank`'s pieces into `tmp_dir` as `__<rank>_0.distcp` (each piece cut into the
/// boxes of its shape that its flat range covers, at most 2 per dimension) and a small index
/// for commit_dcp_save; rank 0 also writes `shard.common` (param_groups, Adam's steps, epoch, ...)
/// as DCP's bytes items and 0-dim tensors. `parameter_names[k]` is the fully qualified name of
/// the k-th parameter of optimizer 0 (DCP names optimizer state by it). Throws UsageError for a
/// rank outside [0, world_size), a piece as write_shard refuses it, more than one optimizer
/// (DCP's get_state_dict merges them into one; save them as Lockstep's sharded format), and an
/// optimizer state key whose parameter has no name.
void write_dcp_shard(const std::string& tmp_dir, int rank, int world_size, const ShardedCheckpoint& shard,
                     const std::vector<std::string>& parameter_names);

/// On rank 0, once every rank's write_dcp_shard has returned: checks that every rank's file is
/// there and that the chunks of each tensor agree on size and dtype and cover it exactly once,
/// writes `.metadata` and moves `tmp_dir` to `final_dir` in one rename (as commit_sharded_save).
/// Throws UsageError naming the rank or the key, leaving the checkpoint at `final_dir` unchanged.
void commit_dcp_save(const std::string& tmp_dir, const std::string& final_dir, int world_size);

// --- reading ---------------------------------------------------------------------------------

/// True when `path` is a directory with a `.metadata` file.
bool is_dcp_checkpoint(const std::string& path);

/// The full shape and dtype of each piece key (Lockstep's names, by the table above) of the DCP
/// checkpoint `dir` (`ranks` left empty: DCP's chunks are boxes, not flat ranges). Throws UsageError naming the path, what is wrong and the fix for a missing
/// or damaged `.metadata`, one that holds anything but DCP's Metadata, chunks that do not cover a
/// tensor exactly once or lie outside it, and keys that do not map to Lockstep's.
std::map<std::string, ShardedTensorInfo> read_dcp_tensors(const std::string& dir);

/// The optimizer's parameter names in the DCP checkpoint `dir`, in the order that numbers them
/// (`k` of the table above: optim.param_groups' "params", group after group); empty without an
/// optimizer. A run compares them with its own to refuse a checkpoint of other parameters.
std::vector<std::string> read_dcp_parameter_names(const std::string& dir);

/// What load_sharded_pieces does, for a DCP checkpoint: for each key of `wanted`, the elements
/// [begin, begin + numel) of its full tensor, copied from the chunks that hold them (only those
/// are read), and the common dict. `into[key]`, where given as a 1-D tensor of the range's numel
/// and the checkpoint's dtype (a live parameter's piece, say), receives the elements and is the
/// piece returned, so that no other memory is taken for it (PyTorch's dcp.load reads into the
/// state dict's tensors alike); a failed read may leave it half written. Throws UsageError as
/// read_dcp_tensors does, for a damaged or missing .distcp file or record, and for a wanted key
/// the checkpoint lacks or a range outside it.
ShardedCheckpoint load_dcp_pieces(const std::string& dir, const std::map<std::string, PieceRange>& wanted,
                                  const std::map<std::string, at::Tensor>& into = {});

/// The whole DCP checkpoint `dir`: the common dict and every piece key's full tensor.
///   CheckpointIO().save(to_full_checkpoint(load_dcp(dir)), "full.ckpt");
ReassembledCheckpoint load_dcp(const std::string& dir);

}  // namespace checkpoint
}  // namespace lockstep
