// Uses the installed Lockstep the way README's example does (one process: the local environment).
#include <lockstep/lockstep.h>
using namespace lockstep;

int main() {
  auto env = environments::detect_environment(environments::Environ::from_process());
  auto group = distributed::ProcessGroup::init(
      env->process_group_options().timeout(std::chrono::seconds(60)));
  auto loss = torch::tensor({1.0f + group->rank()});
  distributed::all_reduce(*group, loss);                 // mean over ranks, in place
  distributed::barrier(*group, "after_loss");
  const bool ok = loss.item<float>() == 1.0f && env->name() == "local";
  distributed::rank_zero_only([&] {
    std::cout << "package consumer: " << env->name() << " environment, all_reduce " << (ok ? "ok" : "WRONG") << "\n";
  });
  return ok ? 0 : 1;
}
