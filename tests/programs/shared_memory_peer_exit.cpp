// Two processes share a SharedMemoryAllreduce; rank 1 exits without reducing and rank 0's
// allreduce must fail naming it, well within the 60 s timeout. Prints rank 0's error; exits 0
// if there was one, 1 if the allreduce succeeded, 3 if shared memory was refused.
//   shared_memory_peer_exit                  rank 1 exits before reducing
//   shared_memory_peer_exit inside-barrier   rank 1 arrives last at the first barrier and dies
//                                            before it releases rank 0
#include <lockstep/distributed/comm/shared_memory_allreduce.h>
#include <lockstep/launchers/worker_environment.h>

#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <iostream>
#include <string>
#include <thread>

#include <torch/torch.h>

int main(int argc, char** argv) {
  using namespace lockstep::distributed;
  const bool inside_barrier = argc > 1 && std::string(argv[1]) == "inside-barrier";
  const int port = lockstep::launchers::find_free_port();
  const pid_t child = fork();
  const int rank = child == 0 ? 1 : 0;
  auto group = ProcessGroup::init(ProcessGroupOptions(rank, 2).main_port(port).timeout(std::chrono::seconds(60)));
  std::string why;
  auto shared = SharedMemoryAllreduce::connect(*group, 4096, "", &why);
  if (!shared) {
    std::cout << "refused: " << why << std::endl;
    return 3;
  }
  if (rank == 1) {
    if (!inside_barrier) _exit(0);  // leaves without reducing (and without saying goodbye to Gloo)
    // Arrive after rank 0 so that this rank is the last, then die before releasing it.
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    lockstep::distributed::detail::die_after_arriving_last();
    shared->allreduce(0, torch::ones({16}), 2)->wait();
    _exit(4);  // not reached
  }
  auto future = shared->allreduce(0, torch::ones({16}), 2);
  future->wait();
  waitpid(child, nullptr, 0);
  if (!future->hasError()) return 1;
  std::cout << future->tryRetrieveErrorMessage() << std::endl;
  std::_Exit(0);  // rank 1's Gloo pair is gone: skip the group's teardown
}
