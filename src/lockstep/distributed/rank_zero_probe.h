#pragma once
// Finding rank 0's store before joining it (not installed): a rank that is not rank 0 must not
// wait out the whole rendezvous timeout on a port that another program holds.

#include <chrono>
#include <string>

namespace lockstep {
namespace distributed {
namespace detail {

/// How long rank 0's store has to answer once something accepts connections on its port. Rank 0
/// writes its job's size into the store right after it starts listening; a store answers in
/// microseconds.
constexpr std::chrono::seconds kRankZeroAnswers{10};

/// Returns once rank 0 of a Lockstep job listens at `address`:`port`. Waits up to `timeout` for
/// something to accept connections there, then up to kRankZeroAnswers (or `timeout`, if shorter)
/// for it to answer as rank 0's store does. Throws DistributedError naming `who`, the endpoint and
/// the fix: nothing listened within the timeout, or something listens that is not rank 0 of a
/// Lockstep job (a port taken by another program, or another job's store).
void await_rank_zero(const std::string& address, int port, std::chrono::milliseconds timeout,
                     const std::string& who);

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
