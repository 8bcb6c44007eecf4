#pragma once
/// Rank-zero helpers: do something once per job, and prefix log lines with the rank.

#include <string>
#include <utility>

namespace lockstep {
namespace distributed {

/// This process's global rank: set by set_global_rank() once a process group exists, else
/// read from RANK, SLURM_PROCID, OMPI_COMM_WORLD_RANK, PMI_RANK or JSM_NAMESPACE_RANK (as
/// Lightning's rank_zero_only does), else 0.
int global_rank();
void set_global_rank(int rank);

/// Runs `fn` on global rank 0 only.
///   rank_zero_only([&] { std::cout << "saved " << path << "\n"; });
template <typename Fn>
void rank_zero_only(Fn&& fn) {
  if (global_rank() == 0) std::forward<Fn>(fn)();
}

/// Writes "[rank N] message" to stderr, as one write so that ranks do not interleave.
void rank_log(const std::string& message);
/// rank_log on rank 0 only.
void rank_zero_log(const std::string& message);

}  // namespace distributed
}  // namespace lockstep
