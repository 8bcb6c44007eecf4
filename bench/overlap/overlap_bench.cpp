// bench_overlap: does DDP's gradient communication run while backward still computes?
//
// Launches 2 ranks (as `lockstep launch` does: the program re-executes itself with RANK etc.
// set, unless an environment already started the ranks) that train a ~25M-parameter MLP with
// DistributedDataParallel over gloo. Rank 0 prints, per step, when each bucket's gradients were
// ready and when its allreduce started and finished, in ms from the call to backward() and
// relative to the end of autograd's backward; then the share of the allreduce time that ran
// during backward (hidden), median over steps.
//
//   build/bin/bench_overlap --steps 10 --bucket-cap-mb 25 [--json]
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <lockstep/core/blas.h>
#include <lockstep/distributed/collectives.h>
#include <lockstep/distributed/ddp/ddp.h>
#include <lockstep/environments/cluster_environment.h>
#include <lockstep/launchers/launch.h>

namespace {

using namespace lockstep;
using Clock = std::chrono::steady_clock;

struct Args {
  int nproc = 2;
  int steps = 10;
  int warmup = 2;
  int64_t batch = 64;
  int64_t width = 2048;
  int layers = 7;  // 1024 -> width, (layers - 2) x width -> width, width -> 1024: ~25.2M parameters
  int threads = 1;
  double bucket_cap_mb = 25;
  bool json = false;
};

struct Mlp : torch::nn::Module {
  explicit Mlp(const Args& a) {
    int64_t in = 1024;
    for (int k = 0; k < a.layers; ++k) {
      const int64_t out = k + 1 == a.layers ? 1024 : a.width;
      layers.push_back(register_module("fc" + std::to_string(k), torch::nn::Linear(in, out)));
      in = out;
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    for (size_t k = 0; k < layers.size(); ++k) {
      x = layers[k](x);
      if (k + 1 < layers.size()) x = torch::relu(x);
    }
    return x;
  }
  std::vector<torch::nn::Linear> layers;
};

double ms(std::chrono::nanoseconds t) { return static_cast<double>(t.count()) / 1e6; }

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

// Length of the union of [start, end) intervals, and of its part before `cut`.
std::pair<double, double> union_length(std::vector<std::pair<double, double>> spans, double cut) {
  std::sort(spans.begin(), spans.end());
  double total = 0, before = 0, start = 0, end = -1;
  auto flush = [&] {
    if (end <= start) return;
    total += end - start;
    before += std::max(0.0, std::min(end, cut) - start);
  };
  for (const auto& s : spans) {
    if (s.first > end) {
      flush();
      start = s.first;
      end = s.second;
    } else {
      end = std::max(end, s.second);
    }
  }
  flush();
  return {total, before};
}

int run_worker(const Args& args) {
  torch::set_num_threads(args.threads);
  const auto env = environments::detect_environment(environments::Environ::from_process());
  auto group = distributed::ProcessGroup::init(env->process_group_options().timeout(std::chrono::seconds(300)));
  auto& g = *group;
  torch::manual_seed(1);
  auto model = std::make_shared<Mlp>(args);
  int64_t parameters = 0;
  for (const auto& p : model->parameters()) parameters += p.numel();
  distributed::DistributedDataParallel<Mlp> ddp(model, g, distributed::DDPOptions().bucket_cap_mb(args.bucket_cap_mb));
  torch::optim::SGD opt(ddp.parameters(), 0.001);
  auto x = torch::randn({args.batch, 1024});
  auto y = torch::randn({args.batch, 1024});
  const bool print = g.rank() == 0;
  if (print && !args.json) {
    std::printf("bench_overlap: %d ranks (gloo), MLP %d layers, %.1fM parameters, batch %lld per rank, %d thread(s) "
                "per rank, bucket_cap_mb %g\n",
                g.world_size(), args.layers, parameters / 1e6, static_cast<long long>(args.batch), args.threads,
                args.bucket_cap_mb);
    std::printf("times in ms from the call to backward(); 'vs end' is relative to the end of autograd's backward "
                "(negative: during backward)\n");
  }
  std::vector<double> hidden_share, comm_ms, exposed_ms, backward_ms, step_ms;
  for (int step = 0; step < args.warmup + args.steps; ++step) {
    distributed::barrier(g, "overlap step");
    const auto step_start = Clock::now();
    opt.zero_grad();
    auto loss = torch::mse_loss(ddp.forward(x), y);
    const auto call = Clock::now();
    loss.backward();
    const auto returned = Clock::now();
    opt.step();
    const auto step_end = Clock::now();
    if (step < args.warmup) continue;
    const auto& trace = ddp.last_trace();
    // The reducer measures from the first gradient; shift everything to the call to backward().
    const double zero = ms(std::chrono::duration_cast<std::chrono::nanoseconds>(trace.backward_start - call));
    // A bucket reduced in its comm hook (shared memory's last) held up autograd: its end is there.
    double end = zero + ms(trace.backward_end);
    for (const auto& b : trace.buckets) {
      if (b.reduced_in_hook) end = std::min(end, zero + ms(b.launched));
    }
    std::vector<std::pair<double, double>> spans;
    nlohmann::json buckets = nlohmann::json::array();
    if (print && !args.json) {
      std::printf("step %d: first gradient %.2f, backward end %.2f, gradients written %.2f, backward() returned %.2f\n",
                  step - args.warmup, zero, end, zero + ms(trace.finished),
                  ms(std::chrono::duration_cast<std::chrono::nanoseconds>(returned - call)));
    }
    for (const auto& b : trace.buckets) {
      const double ready = zero + ms(b.ready), launched = zero + ms(b.launched), reduced = zero + ms(b.reduced);
      spans.emplace_back(launched, reduced);
      if (print && !args.json) {
        std::printf("  bucket %zu (%2zu params, %6.1f MB): ready %8.2f  allreduce start %8.2f (vs end %+8.2f)  "
                    "finish %8.2f (vs end %+8.2f)\n",
                    b.index, b.parameters, b.bytes / 1048576.0, ready, launched, launched - end, reduced,
                    reduced - end);
      }
      buckets.push_back({{"bucket", b.index}, {"bytes", b.bytes}, {"ready_ms", ready}, {"allreduce_start_ms", launched},
                         {"allreduce_finish_ms", reduced}, {"start_vs_backward_end_ms", launched - end}});
    }
    const auto u = union_length(spans, end);
    const double share = u.first > 0 ? u.second / u.first : 0;
    hidden_share.push_back(share);
    comm_ms.push_back(u.first);
    exposed_ms.push_back(u.first - u.second);
    backward_ms.push_back(end);
    step_ms.push_back(ms(std::chrono::duration_cast<std::chrono::nanoseconds>(step_end - step_start)));
    if (!print) continue;
    if (args.json) {
      std::cout << nlohmann::json{{"event", "overlap_step"}, {"step", step - args.warmup}, {"backward_end_ms", end},
                                  {"allreduce_ms", u.first}, {"hidden_ms", u.second}, {"hidden_share", share},
                                  {"buckets", buckets}}
                       .dump()
                << std::endl;
    } else {
      std::printf("  allreduce busy %.2f ms, of which %.2f ms during backward (%.0f%% hidden), %.2f ms after\n",
                  u.first, u.second, 100 * share, u.first - u.second);
    }
  }
  if (print) {
    if (args.json) {
      std::cout << nlohmann::json{{"event", "overlap_summary"},      {"world_size", g.world_size()},
                                  {"parameters", parameters},         {"steps", args.steps},
                                  {"median_hidden_share", median(hidden_share)},
                                  {"median_allreduce_ms", median(comm_ms)}, {"median_exposed_ms", median(exposed_ms)},
                                  {"median_backward_ms", median(backward_ms)}, {"median_step_ms", median(step_ms)}}
                       .dump()
                << std::endl;
    } else {
      std::printf("summary over %d steps (median): backward %.2f ms, allreduce busy %.2f ms, hidden behind backward "
                  "%.0f%%, exposed after backward %.2f ms, step %.2f ms\n",
                  args.steps, median(backward_ms), median(comm_ms), 100 * median(hidden_share), median(exposed_ms),
                  median(step_ms));
    }
    std::fflush(stdout);
  }
  distributed::barrier(g, "overlap end");
  return 0;
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

int main(int argc, char** argv) {
  Args args;
  CLI::App app("Trace of DDP's bucket allreduces against backward, on a ~25M-parameter MLP");
  app.add_option("--nproc", args.nproc, "ranks to launch")->check(CLI::Range(2, 64))->capture_default_str();
  app.add_option("--steps", args.steps, "traced steps")->check(CLI::Range(1, 100000))->capture_default_str();
  app.add_option("--warmup", args.warmup, "untraced steps first (the first rebuilds buckets)")->capture_default_str();
  app.add_option("--batch", args.batch, "rows per rank")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--width", args.width, "hidden width")->check(CLI::Range(1, 1 << 16))->capture_default_str();
  app.add_option("--layers", args.layers, "linear layers")->check(CLI::Range(2, 1000))->capture_default_str();
  app.add_option("--threads", args.threads, "intra-op threads per rank")->check(CLI::Range(1, 1024))->capture_default_str();
  app.add_option("--bucket-cap-mb", args.bucket_cap_mb, "DDP bucket cap")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_flag("--json", args.json, "JSON lines instead of the table");
  CLI11_PARSE(app, argc, argv);
  try {
    const auto env = environments::detect_environment(environments::Environ::from_process());
    if (env->creates_processes_externally()) return run_worker(args);
    core::warn_if_reference_blas();
    return launchers::launch_and_supervise(launchers::LaunchOptions().nproc_per_node(args.nproc), own_command_line());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_overlap: %s\n", e.what());
    return 1;
  }
}
