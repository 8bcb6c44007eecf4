#pragma once
// The ranks' own corner of torchrun's agent store (not installed). PyTorch 2.x's torchrun keeps
// one store for the whole job (TORCHELASTIC_USE_AGENT_STORE=True), and a job that re-forms
// because a node joined keeps its TORCHELASTIC_RESTART_COUNT, so the ranks of the new round would
// read the last round's keys (pytorch/pytorch#135712). The ranks first agree on a number no
// earlier round used, and write everything else under it.

#include <chrono>
#include <string>

#include <torch/csrc/distributed/c10d/Store.hpp>

namespace lockstep {
namespace distributed {
namespace detail {

/// The key prefix of this round of the job: "lockstep/round_<N>", N new to `store`. Rank 0 takes
/// the next N from a counter; every other rank writes a random word, and takes N from rank 0's
/// answer that repeats the word (an answer left from an earlier round cannot). Rank 0 returns
/// once every rank has taken it. Only ranks of one round may meet here, as under torchrun, which
/// stops every worker before the next round starts. Throws DistributedError naming `who`,
/// `endpoint` and the ranks missing after `timeout`, or the fix when the store gives no answer to
/// the first request within kRankZeroAnswers (a store of PyTorch 2.x and a client of LibTorch 1.x).
std::string agree_on_round(const c10::intrusive_ptr<c10d::Store>& store, int rank, int world_size,
                           std::chrono::milliseconds timeout, const std::string& who, const std::string& endpoint);

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
