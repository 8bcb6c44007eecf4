#include <lockstep/distributed/ddp/join.h>

#include <exception>
#include <stdexcept>
#include <string>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include <lockstep/core/error.h>
#include <lockstep/distributed/collectives.h>

namespace lockstep {
namespace distributed {
namespace {

std::string list(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ", ") + std::to_string(r);
  return out;
}

DistributedError early_termination(const ProcessGroup& group, const std::string& ranks) {
  return DistributedError(group.describe() + ": rank(s) " + ranks +
                          " ran out of inputs before the others, and the Join was made with "
                          "JoinOptions().throw_on_early_termination(true), so every rank stops here. Give every rank "
                          "the same number of batches (a DistributedSampler with drop_last), or leave "
                          "throw_on_early_termination false to let the finished ranks shadow the others.");
}

}  // namespace

namespace detail {

JoinState join_handshake(ProcessGroup& group, bool active) {
  // One flag per rank rather than a count: the sum tells how many are active and which.
  auto flags = torch::zeros({group.world_size()}, torch::kInt32);
  if (active) flags[group.rank()] = 1;
  all_reduce(group, flags, ReduceOp::sum, CollectiveOptions().tag("Join handshake"));
  JoinState state;
  const int32_t* f = flags.data_ptr<int32_t>();
  for (int r = 0; r < group.world_size(); ++r) {
    if (f[r] == 0) {
      state.joined_ranks.push_back(r);
      continue;
    }
    ++state.active_ranks;
    state.last_active_rank = r;
  }
  return state;
}

}  // namespace detail

Joinable::~Joinable() = default;

const JoinOptions* Joinable::join_options() const { return join_ ? &join_->options() : nullptr; }

c10::optional<JoinState> Joinable::notify_join_context() {
  if (!join_ || !join_->options().enable()) return c10::nullopt;
  auto& group = join_process_group();
  auto state = detail::join_handshake(group, true);
  if (join_->options().throw_on_early_termination() && state.active_ranks < group.world_size()) {
    throw early_termination(group, list(state.joined_ranks));
  }
  return state;
}

Join::Join(std::vector<Joinable*> joinables, JoinOptions options)
    : joinables_(std::move(joinables)), options_(std::move(options)), exceptions_at_entry_(std::uncaught_exceptions()) {
  if (joinables_.empty()) throw UsageError("Join needs at least one joinable (e.g. Join({&ddp})).");
  for (auto* joinable : joinables_) {
    if (!joinable) throw UsageError("Join: a joinable is null.");
    if (joinable->join_) {
      throw UsageError("Join: a joinable is already inside another Join; nest no Joins over the same object.");
    }
  }
  for (auto* joinable : joinables_) joinable->join_ = this;
}

Join::~Join() noexcept(false) {
  if (finished_ || !options_.enable() || std::uncaught_exceptions() > exceptions_at_entry_) {
    release();
    return;
  }
  finish();
}

void Join::finish() {
  if (finished_) return;
  finished_ = true;
  if (!options_.enable()) {
    release();
    return;
  }
  try {
    bool is_last_joiner = true;
    auto& group = joinables_.front()->join_process_group();
    for (;;) {
      const JoinState state = detail::join_handshake(group, false);
      if (state.active_ranks == 0) break;
      if (options_.throw_on_early_termination()) throw early_termination(group, list(state.joined_ranks));
      joinables_.front()->join_main_hook(state);
      for (size_t k = 1; k < joinables_.size(); ++k) {
        joinables_[k]->join_main_hook(detail::join_handshake(joinables_[k]->join_process_group(), false));
      }
      is_last_joiner = false;
    }
    for (auto* joinable : joinables_) joinable->join_post_hook(is_last_joiner);
  } catch (...) {
    release();
    throw;
  }
  release();
}

void Join::release() {
  for (auto* joinable : joinables_) joinable->join_ = nullptr;
  joinables_.clear();
}

}  // namespace distributed
}  // namespace lockstep
