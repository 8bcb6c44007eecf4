#pragma once
/// Join: training with uneven inputs. A rank that runs out of batches keeps answering the
/// collectives of the ranks that still have some (zero gradients, buffer broadcasts), so that no
/// rank hangs; when all are done, the model of a rank that finished last is copied to the others.
/// The C++ counterpart of torch.distributed.algorithms.Join.

#include <vector>

#include <c10/util/Optional.h>

#include <lockstep/distributed/ddp/join_options.h>
#include <lockstep/distributed/process_group.h>

namespace lockstep {
namespace distributed {

class Join;

/// One iteration's view of which ranks still have inputs.
struct JoinState {
  /// Ranks that still had inputs in this iteration.
  int active_ranks = 0;
  /// The highest of them (-1 when none): the source of state that must be shared.
  int last_active_rank = -1;
  /// The ranks that had run out of inputs.
  std::vector<int> joined_ranks;
};

/// Something whose iterations make collectives that a joined rank must shadow
/// (DistributedDataParallel is one). Every rank must hold the same joinables in the same order.
class Joinable {
 public:
  virtual ~Joinable();

  /// Makes, with zero contributions, the collectives that one iteration makes on a rank that
  /// still has inputs. `state` is what that iteration's notify_join_context() returned there.
  virtual void join_main_hook(const JoinState& state) = 0;
  /// Once all ranks have joined. `is_last_joiner`: this rank ran out of inputs last.
  virtual void join_post_hook(bool is_last_joiner) {}
  /// The group the join's handshakes run on.
  virtual ProcessGroup& join_process_group() = 0;

 protected:
  /// Call at the start of each iteration (DDP calls it before each forward). Inside an enabled
  /// Join: tells the joined ranks this one still has inputs (a collective) and returns who does;
  /// with throw_on_early_termination, throws DistributedError if some rank has none. Outside a
  /// Join: nullopt, no communication.
  c10::optional<JoinState> notify_join_context();
  /// The options of the Join this joinable is in, or nullptr.
  const JoinOptions* join_options() const;

 private:
  friend class Join;
  Join* join_ = nullptr;
};

/// While alive, the joinables may see uneven inputs across ranks. When it goes out of scope (or
/// at finish()) a rank that ran out of inputs shadows the others' iterations until every rank has
/// finished, then runs the joinables' post hooks:
///
///   {
///     Join join({&ddp});  // or: auto join = ddp.join();
///     for (auto& batch : loader) {  // 10 batches on one rank, 13 on another
///       opt.zero_grad();
///       loss_fn(ddp.forward(batch.data), batch.target).backward();
///       opt.step();
///     }
///   }  // waits here, answering the other ranks' collectives, until every rank is done
///
/// If an exception leaves the scope, the Join does nothing (as PyTorch's Join.__exit__).
class Join {
 public:
  explicit Join(std::vector<Joinable*> joinables, JoinOptions options = {});
  /// Calls finish() unless it ran or an exception is unwinding; may throw DistributedError.
  ~Join() noexcept(false);
  Join(const Join&) = delete;
  Join& operator=(const Join&) = delete;

  /// Shadows the other ranks' iterations until every rank has joined, then runs the post hooks.
  /// A collective: every rank calls it once, after its last iteration.
  void finish();
  const JoinOptions& options() const { return options_; }

 private:
  void release();

  std::vector<Joinable*> joinables_;
  JoinOptions options_;
  int exceptions_at_entry_;
  bool finished_ = false;
};

namespace detail {
/// The handshake of one iteration on `group`: each rank says whether it still has inputs.
JoinState join_handshake(ProcessGroup& group, bool active);
}  // namespace detail

}  // namespace distributed
}  // namespace lockstep
