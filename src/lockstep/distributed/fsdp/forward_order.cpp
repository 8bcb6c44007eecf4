#include "forward_order.h"

#include <algorithm>

namespace lockstep {
namespace distributed {
namespace detail {

ForwardOrder::ForwardOrder(size_t units) : next_(units, none), previous_(units, none) {
  // Gradients arrive from the last layers first: children in reverse order, the root last.
  for (size_t u = units; u-- > 1;) reduce_order_.push_back(u);
  if (units > 0) reduce_order_.push_back(0);
}

void ForwardOrder::ran(size_t unit) {
  if (known_ || std::find(order_.begin(), order_.end(), unit) != order_.end()) return;
  order_.push_back(unit);
}

void ForwardOrder::learn() {
  known_ = true;
  for (size_t k = 0; k + 1 < order_.size(); ++k) {
    next_[order_[k]] = order_[k + 1];
    previous_[order_[k + 1]] = order_[k];
  }
  std::vector<size_t> order(order_.rbegin(), order_.rend());
  for (size_t u : reduce_order_) {
    if (std::find(order.begin(), order.end(), u) == order.end()) order.push_back(u);
  }
  reduce_order_ = std::move(order);
}

}  // namespace detail
}  // namespace distributed
}  // namespace lockstep
