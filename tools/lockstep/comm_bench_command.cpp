// `lockstep comm-bench`: launches ranks, checks every collective's result, and prints time,
// algbw and busbw per size beside raw ProcessGroupGloo calls measured in the same run.
// busbw follows nccl-tests (doc/PERFORMANCE.md): allreduce algbw*2(n-1)/n, allgather
// algbw*(n-1)/n, broadcast algbw; sizes are the total bytes of the result, as there.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

#include <nlohmann/json.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include <lockstep/core/blas.h>
#include <lockstep/core/number_text.h>
#include <lockstep/core/error.h>
#include <lockstep/distributed/collectives.h>
#include <lockstep/environments/cluster_environment.h>
#include <lockstep/launchers/launch.h>

#include "commands.h"

namespace lockstep {
namespace tool {
namespace {

struct BenchArgs {
  int nproc_per_node = 2;
  std::string sizes = "1M,25M,100M";
  std::string ops = "allreduce,broadcast,allgather";
  int iters = 20;
  int warmup = 3;
  double timeout = 120;
  bool json = false;
};

int64_t parse_size(const std::string& text) {
  static const std::string units = "KMG";
  std::string digits = text;
  int64_t scale = 1;
  if (!text.empty()) {
    const auto unit = units.find(static_cast<char>(std::toupper(text.back())));
    if (unit != std::string::npos) {
      scale = int64_t{1} << (10 * (unit + 1));
      digits = text.substr(0, text.size() - 1);
    }
  }
  const double value = whole_number(digits).value_or(0);
  if (value <= 0) {
    throw UsageError("--sizes: '" + text + "' is not a size; use bytes with an optional K, M or G suffix "
                     "(powers of 1024, as nccl-tests), e.g. --sizes 1M,25M,100M.");
  }
  return static_cast<int64_t>(value * static_cast<double>(scale));
}

std::vector<std::string> split(const std::string& text) {
  std::vector<std::string> items;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    if (!item.empty()) items.push_back(item);
  }
  return items;
}

double bus_factor(const std::string& op, int n) {
  if (op == "allreduce") return 2.0 * (n - 1) / n;
  if (op == "allgather") return static_cast<double>(n - 1) / n;
  return 1.0;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// One collective, run by Lockstep's API or by the raw c10d backend, with its result check.
struct Case {
  std::function<void()> prepare;  // refill inputs (not timed)
  std::function<void()> lockstep;
  std::function<void()> raw;
  std::function<bool()> correct;      // checks the last Lockstep result (not timed)
  std::function<bool()> raw_correct;  // checks the last raw result (not timed)
};

Case make_case(distributed::ProcessGroup& g, const std::string& op, int64_t bytes) {
  const int n = g.world_size();
  const int64_t total = std::max<int64_t>(1, bytes / 4);
  const float rank = static_cast<float>(g.rank());
  auto backend = g.backend();
  if (op == "allreduce") {
    auto t = torch::empty({total});
    return {[t, rank] { t.fill_(rank + 1); },
            [&g, t] { distributed::all_reduce(g, t, distributed::ReduceOp::sum); },
            [backend, t] {
              std::vector<at::Tensor> v{t};
              backend->allreduce(v)->wait();
            },
            [t, n] { return t.eq(n * (n + 1) / 2.0f).all().item<bool>(); },
            [t, n] { return t.eq(n * (n + 1) / 2.0f).all().item<bool>(); }};
  }
  if (op == "broadcast") {
    auto t = torch::empty({total});
    return {[t, rank] { t.fill_(rank == 0 ? 7.0f : -1.0f); },
            [&g, t] { distributed::broadcast_tensor(g, t, 0); },
            [backend, t] {
              std::vector<at::Tensor> v{t};
              backend->broadcast(v)->wait();
            },
            [t] { return t.eq(7.0f).all().item<bool>(); },
            [t] { return t.eq(7.0f).all().item<bool>(); }};
  }
  if (op == "allgather") {
    auto in = torch::empty({std::max<int64_t>(1, total / n)});
    auto parts = std::make_shared<std::vector<at::Tensor>>();
    auto raw_out = std::make_shared<std::vector<std::vector<at::Tensor>>>(1);
    for (int r = 0; r < n; ++r) (*raw_out)[0].push_back(torch::empty_like(in));
    return {[in, rank] { in.fill_(rank); },
            [&g, in, parts] { *parts = distributed::all_gather(g, in); },
            [backend, in, raw_out] {
              std::vector<at::Tensor> v{in};
              backend->allgather(*raw_out, v)->wait();
            },
            [parts, n] {
              if (static_cast<int>(parts->size()) != n) return false;
              for (int r = 0; r < n; ++r) {
                if (!(*parts)[r].eq(static_cast<float>(r)).all().item<bool>()) return false;
              }
              return true;
            },
            [raw_out, n] {
              for (int r = 0; r < n; ++r) {
                if (!(*raw_out)[0][r].eq(static_cast<float>(r)).all().item<bool>()) return false;
              }
              return true;
            }};
  }
  throw UsageError("--ops: '" + op + "' is not a benchmarked collective; use allreduce, broadcast, allgather.");
}

double timed(const std::function<void()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// Runs one rank's share of the benchmark; rank 0 prints.
int run_worker(const BenchArgs& args) {
  const auto env = environments::detect_environment(environments::Environ::from_process());
  auto group = distributed::ProcessGroup::init(
      env->process_group_options().timeout(std::chrono::milliseconds(static_cast<int64_t>(args.timeout * 1000))));
  auto& g = *group;
  const int n = g.world_size();
  bool all_correct = true;
  if (g.rank() == 0 && !args.json) {
    std::printf("lockstep comm-bench: %d ranks, gloo, %d iterations (median, slowest rank per iteration)\n", n,
                args.iters);
    std::printf("%-10s %10s %12s %11s %11s %12s %11s %7s %6s\n", "op", "size", "time_ms", "algbw_GB/s",
                "busbw_GB/s", "raw_time_ms", "raw_busbw", "ratio", "check");
  }
  for (const auto& op : split(args.ops)) {
    for (const auto& size_text : split(args.sizes)) {
      const int64_t bytes = parse_size(size_text);
      Case c = make_case(g, op, bytes);
      for (int i = 0; i < args.warmup; ++i) {
        c.prepare();
        c.lockstep();
        c.prepare();
        c.raw();
      }
      std::vector<double> ours(args.iters), raw(args.iters);
      int wrong = 0;
      for (int i = 0; i < args.iters; ++i) {
        // Alternate which side runs first, so drift in the machine's load hits both alike.
        for (int side = 0; side < 2; ++side) {
          const bool lockstep_now = (side == 0) == (i % 2 == 0);
          c.prepare();
          // Start together: otherwise one rank's leftover work shows up in the other's time.
          g.backend()->barrier()->wait(g.timeout());
          if (lockstep_now) {
            ours[i] = timed(c.lockstep);
          } else {
            raw[i] = timed(c.raw);
          }
          // On a machine with few cores, a rank that checks its result while another is still
          // copying would steal that rank's core: check only once every rank is done, and check
          // both sides so that each is followed by the same work.
          g.backend()->barrier()->wait(g.timeout());
          wrong += (lockstep_now ? c.correct() : c.raw_correct()) ? 0 : 1;
        }
      }
      auto times = torch::tensor(ours, torch::kFloat64);
      auto raw_times = torch::tensor(raw, torch::kFloat64);
      distributed::all_reduce(g, times, distributed::ReduceOp::max);
      distributed::all_reduce(g, raw_times, distributed::ReduceOp::max);
      auto wrong_total = distributed::all_reduce(g, torch::tensor({static_cast<double>(wrong)}, torch::kFloat64),
                                                 distributed::ReduceOp::sum);
      const bool ok = wrong_total.item<double>() == 0;
      all_correct = all_correct && ok;
      if (g.rank() != 0) continue;
      const auto as_vector = [](const at::Tensor& t) {
        return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
      };
      const double t = median(as_vector(times)), tr = median(as_vector(raw_times));
      const double algbw = static_cast<double>(bytes) / t / 1e9, raw_algbw = static_cast<double>(bytes) / tr / 1e9;
      const double busbw = algbw * bus_factor(op, n), raw_busbw = raw_algbw * bus_factor(op, n);
      if (args.json) {
        std::cout << nlohmann::json{{"event", "comm_bench"}, {"op", op}, {"bytes", bytes}, {"world_size", n},
                                    {"time_ms", t * 1e3}, {"algbw_gbps", algbw}, {"busbw_gbps", busbw},
                                    {"raw_time_ms", tr * 1e3}, {"raw_busbw_gbps", raw_busbw},
                                    {"busbw_ratio", busbw / raw_busbw}, {"correct", ok}}
                         .dump()
                  << std::endl;
      } else {
        std::printf("%-10s %10s %12.3f %11.3f %11.3f %12.3f %11.3f %7.3f %6s\n", op.c_str(), size_text.c_str(),
                    t * 1e3, algbw, busbw, tr * 1e3, raw_busbw, busbw / raw_busbw, ok ? "ok" : "WRONG");
        std::fflush(stdout);
      }
    }
  }
  distributed::barrier(g, "comm_bench_end");
  return all_correct ? 0 : 1;
}

std::vector<std::string> own_command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::vector<std::string> argv;
  for (std::string arg; std::getline(in, arg, '\0');) argv.push_back(arg);
  if (!argv.empty()) {
    char path[4096];
    const ssize_t len = ::readlink("/proc/self/exe", path, sizeof(path) - 1);
    if (len > 0) argv[0] = std::string(path, static_cast<size_t>(len));
  }
  return argv;
}

}  // namespace

Command add_comm_bench_command(CLI::App& app) {
  auto args = std::make_shared<BenchArgs>();
  auto* sub = app.add_subcommand("comm-bench",
                                 "Check and time collectives on this machine or cluster (under "
                                 "torchrun/srun/mpirun, every started process is one rank)");
  sub->add_option("--nproc-per-node", args->nproc_per_node, "ranks to launch on this node")
      ->check(CLI::Range(1, 1024))->capture_default_str();
  sub->add_option("--sizes", args->sizes, "total bytes per collective, K/M/G = 2^10/2^20/2^30")->capture_default_str();
  sub->add_option("--ops", args->ops, "allreduce,broadcast,allgather")->capture_default_str();
  sub->add_option("--iters", args->iters, "timed iterations per size")->check(CLI::Range(1, 100000))->capture_default_str();
  sub->add_option("--warmup", args->warmup, "untimed iterations first")->check(CLI::Range(0, 100000))->capture_default_str();
  sub->add_option("--timeout", args->timeout, "seconds any collective may take")->check(CLI::Range(0.001, 1e9))->capture_default_str();
  sub->add_flag("--json", args->json, "one JSON line per op and size");
  return {sub, [args] {
            // Validate names before any process starts.
            for (const auto& size : split(args->sizes)) parse_size(size);
            for (const auto& op : split(args->ops)) {
              if (op != "allreduce" && op != "broadcast" && op != "allgather") {
                throw UsageError("--ops: '" + op + "' is not a benchmarked collective; use allreduce, broadcast, allgather.");
              }
            }
            if (split(args->sizes).empty() || split(args->ops).empty()) {
              throw UsageError("--sizes and --ops need at least one value each, e.g. --sizes 25M --ops allreduce.");
            }
            const auto env = environments::detect_environment(environments::Environ::from_process());
            if (env->creates_processes_externally()) return run_worker(*args);
            core::warn_if_reference_blas();
            return launchers::launch_and_supervise(launchers::LaunchOptions().nproc_per_node(args->nproc_per_node),
                                                   own_command_line());
          }};
}

}  // namespace tool
}  // namespace lockstep
