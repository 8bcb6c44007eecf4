#pragma once
/// Options for creating a ProcessGroup.

#include <chrono>
#include <string>

#include <torch/arg.h>

namespace lockstep {
namespace distributed {

/// How the ranks of a job meet and talk.
///
///   auto pg = ProcessGroup::init(ProcessGroupOptions(rank, world_size)
///                                    .main_address("10.0.0.1").main_port(29500)
///                                    .timeout(std::chrono::seconds(60)));
struct ProcessGroupOptions {
  ProcessGroupOptions(int rank, int world_size) : rank_(rank), world_size_(world_size) {}

  /// This process's global rank, 0 <= rank < world_size.
  TORCH_ARG(int, rank);
  /// Number of processes in the job.
  TORCH_ARG(int, world_size);
  /// Address of the TCPStore: rank 0's, or the launcher agent's with use_agent_store.
  /// Default: "127.0.0.1".
  TORCH_ARG(std::string, main_address) = "127.0.0.1";
  /// Port of that TCPStore. Default: 29500.
  TORCH_ARG(int, main_port) = 29500;
  /// The launcher's agent already hosts the TCPStore at main_address:main_port (torchrun's
  /// default static rendezvous sets TORCHELASTIC_USE_AGENT_STORE=True), so every rank, rank 0
  /// included, joins it as a client. The ranks of each rendezvous round first agree on a prefix
  /// no earlier round used, and keep their keys under it: PyTorch 2.x's agent keeps one store for
  /// the whole job. Default: false (rank 0 hosts the store).
  TORCH_ARG(bool, use_agent_store) = false;
  /// A job on one machine: the ranks meet in this file (a c10d FileStore, in a folder only this
  /// user can open) instead of a TCPStore, and Gloo binds to loopback, so the job listens on no
  /// network interface (LibTorch 1.13's TCPStore listens on all of them, whatever main_address
  /// says). The in-process launchers set it (LOCKSTEP_STORE_FILE). Default: "" (TCPStore).
  TORCH_ARG(std::string, store_file) = "";
  /// `gloo` (CPU), or `nccl` (CUDA) where LibTorch has NCCL: available_backends(). Lockstep
  /// builds no MPI process group, so `mpi` is refused. Default: "gloo".
  TORCH_ARG(std::string, backend) = "gloo";
  /// nccl only: this rank's CUDA device (made current before NCCL starts); collectives given CPU
  /// tensors copy them there and back, since NCCL reduces CUDA tensors only. Gloo takes tensors
  /// where they are. Default: -1 (the current CUDA device).
  TORCH_ARG(int, cuda_device) = -1;
  /// Before each collective (all_reduce, all_gather, broadcast, barrier) the ranks compare what
  /// they are about to run, through the store; a difference is an error on every rank naming both
  /// calls, at once instead of at the timeout. Costs a few store round trips per collective.
  /// Also on with LOCKSTEP_DISTRIBUTED_DEBUG=detail. Default: false.
  TORCH_ARG(bool, check_collectives) = false;
  /// Every blocking call (rendezvous, collectives, barriers) fails after this long.
  /// Default: 1800 s, as in Lightning Fabric and PyTorch.
  TORCH_ARG(std::chrono::milliseconds, timeout) = std::chrono::seconds(1800);
  /// A rank that stops answering (its host gone, its process frozen) ends the job within this
  /// long, however long `timeout` is: every rank beats through the store from a background
  /// thread, and the ranks that find one silent for this long print which and exit with code 1,
  /// so that the launcher ends the job or torchrun's agent restarts it. A slow step is not
  /// silence. Started by init() in jobs of two or more ranks; zero turns it off. Default: 15 s
  /// (torchrun's rendezvous keep-alive: 3 beats of 5 s), so that a job ends within 30 s.
  TORCH_ARG(std::chrono::milliseconds, liveness_timeout) = std::chrono::seconds(15);
};

}  // namespace distributed
}  // namespace lockstep
