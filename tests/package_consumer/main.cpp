// Uses the installed Lockstep: a one-rank process group over an in-memory store, one all_reduce.
#include <iostream>

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/torch.h>

#include <lockstep/distributed/collectives.h>

int main() {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto group = lockstep::distributed::ProcessGroup::init_with_store(
      store, lockstep::distributed::ProcessGroupOptions(0, 1));
  auto t = lockstep::distributed::all_reduce(*group, torch::tensor({2.0f, 4.0f}));
  const bool ok = t.equal(torch::tensor({2.0f, 4.0f}));
  std::cout << "package consumer: all_reduce over 1 rank " << (ok ? "ok" : "WRONG") << "\n";
  return ok ? 0 : 1;
}
