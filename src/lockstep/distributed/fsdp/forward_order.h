#pragma once
// ForwardOrder: the order the first training forward ran the child units in, which the root
// follows to prefetch the next unit's gather (forward) and the previous one's (backward), and
// the order units' gradients are reduced in (not installed).

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lockstep {
namespace distributed {
namespace detail {

class ForwardOrder {
 public:
  /// No unit: SIZE_MAX.
  static constexpr size_t none = SIZE_MAX;

  /// Units 1 .. units - 1 are children; 0 is the root. Until learn(), gradients are reduced in the
  /// children's reverse module order, the root last.
  explicit ForwardOrder(size_t units);

  bool known() const { return known_; }
  /// During the first training forward: `unit` ran (again: ignored).
  void ran(size_t unit);
  /// After the first backward: the order seen is the order from now on. Gradients are then
  /// reduced in its reverse (the same on every rank, which ran the same forward), followed by
  /// the units that forward did not run, the root last.
  void learn();

  size_t first() const { return order_.empty() ? none : order_.front(); }
  size_t last() const { return order_.empty() ? none : order_.back(); }
  size_t next(size_t unit) const { return next_[unit]; }
  size_t previous(size_t unit) const { return previous_[unit]; }
  const std::vector<size_t>& reduce_order() const { return reduce_order_; }

 private:
  std::vector<size_t> order_;
  bool known_ = false;
  std::vector<size_t> next_, previous_;
  std::vector<size_t> reduce_order_;
};

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
