// DDP training throughput of Lockstep, the C++ side of bench/ddp/ddp_bench.py (PyTorch DDP):
// same network, same initial weights (seeded the same way), same synthetic batches, same SGD, gloo.
//   bench_ddp --model small|25m|cnn --nproc-per-node 2 --steps 100 --warmup 10 --batch 64
// --accelerator cuda puts rank r on GPU r % (GPU count), so 2 ranks can share one GPU through
// Gloo's CUDA path (scripts/gpu-check).
// Prints one JSON line on rank 0: steps/s over the timed steps, the final loss, the wall-clock
// time (Unix seconds) when rank 0's first optimizer step returned, every rank's peak RSS, and the
// share of the timed section's CPU time (all ranks) that the liveness watch's threads used.
// bench/run runs it beside the Python side and compares.
// --liveness-blocks N (bench/run section 12): the timed steps in 2N blocks, a fresh liveness watch
// running in every other block (ABBA order) and none in the rest, so that the machine's drift
// hits both sides alike; prints the on blocks' steps/s over the off blocks'.
// --profile: where each rank's timed steps went (bench/run section 13): forward (with the loss and
// zero_grad), backward until autograd ended, the wait for the reduction after it (on one machine
// split in two, see kPartNames), the optimizer; the median and the mean of each, in ms, per rank.
// --sync-only (bench/run section 13): the same steps without DDP, the ranks kept in lock-step by
// a 16-float all-reduce on DDP's shared-memory transport after each backward (no gradients
// exchanged): what a step costs when the ranks wait for each other and nothing else.
// Every run also says what the timed steps cost in CPU time ("cpu"): ms per step on all of a
// rank's threads and on its main thread, and the share of the machine's CPU time the job's
// processes used, the share idle and the share stolen by the hypervisor (/proc/stat).
#include <sys/resource.h>
#include <time.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include <algorithm>
#include <array>
#include <chrono>
#include <functional>
#include <iostream>
#include <numeric>
#include <sstream>
#include <thread>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <lockstep/cli/guarded_main.h>
#include <lockstep/distributed/collectives.h>
#include <lockstep/distributed/comm/shared_memory_allreduce.h>
#include <lockstep/distributed/ddp/ddp.h>
#include <lockstep/environments/cluster_environment.h>
#include <lockstep/environments/torchelastic_environment.h>
#include <lockstep/launchers/local_launcher.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "../../src/lockstep/distributed/liveness_watch.h"

namespace {

using namespace lockstep;

// Seconds this process's threads named ls-alive-* (the liveness watch's) have run on a CPU
// (/proc/self/task/*/schedstat: nanoseconds, exact, unlike the 10 ms ticks of stat).
double liveness_cpu_seconds() {
  double total = 0;
  for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
    std::string name;
    std::getline(std::ifstream(task.path() / "comm"), name);
    if (name.rfind("ls-alive", 0) != 0) continue;
    double ns = 0;
    std::ifstream(task.path() / "schedstat") >> ns;
    total += ns / 1e9;
  }
  return total;
}

// CPU seconds all of this process's threads have used, and the calling thread.
double process_cpu_seconds() {
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);
  const auto seconds = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return seconds(usage.ru_utime) + seconds(usage.ru_stime);
}
double thread_cpu_seconds() {
  timespec t{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + t.tv_nsec / 1e9;
}

// The machine's CPU time so far in ticks, from /proc/stat's first line: {all, idle (with iowait), steal}.
std::array<double, 3> machine_ticks() {
  std::ifstream stat("/proc/stat");
  std::string cpu;
  double v[8] = {0, 0, 0, 0, 0, 0, 0, 0};  // user nice system idle iowait irq softirq steal
  stat >> cpu;
  for (double& x : v) stat >> x;
  return {std::accumulate(v, v + 8, 0.0), v[3] + v[4], v[7]};
}

// Linear widths: "small" is the Fashion-MNIST MLP; "25m" has 24.2M parameters; "cnn" is the
// linear head of examples/fashion_mnist's CNN.
std::vector<int64_t> widths(const std::string& model) {
  if (model == "small") return {784, 512, 256, 10};
  if (model == "25m") return {784, 4096, 4096, 1024, 10};
  return {64 * 5 * 5, 128, 10};
}

// An MLP, or for "cnn" examples/fashion_mnist's CNN (two 3x3 convolutions with max pooling, then
// two linear layers). Layers are created in forward order, as in ddp_bench.py, so that both
// sides draw the same initial weights from the same seed.
struct NetImpl : torch::nn::Module {
  explicit NetImpl(const std::string& model) {
    if (model == "cnn") {
      convs.push_back(register_module("conv1", torch::nn::Conv2d(torch::nn::Conv2dOptions(1, 32, 3))));
      convs.push_back(register_module("conv2", torch::nn::Conv2d(torch::nn::Conv2dOptions(32, 64, 3))));
    }
    const auto w = widths(model);
    for (size_t i = 0; i + 1 < w.size(); ++i) {
      layers.push_back(register_module("fc" + std::to_string(i + 1), torch::nn::Linear(w[i], w[i + 1])));
    }
  }
  torch::Tensor forward(torch::Tensor x) {
    if (!convs.empty()) {
      x = x.view({x.size(0), 1, 28, 28});
      for (auto& conv : convs) x = torch::max_pool2d(torch::relu(conv(x)), 2);
      x = x.flatten(1);
    }
    for (size_t i = 0; i < layers.size(); ++i) {
      x = layers[i]->forward(x);
      if (i + 1 < layers.size()) x = torch::relu(x);
    }
    return x;
  }
  std::vector<torch::nn::Conv2d> convs;
  std::vector<torch::nn::Linear> layers;
};

// The middle of `v` (the mean of the two middle values for an even count); 0 when empty.
double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t mid = v.size() / 2;
  return v.size() % 2 ? v[mid] : (v[mid - 1] + v[mid]) / 2;
}

// Runs `steps` steps in 2 x `pairs` blocks between barriers; in one block of each pair (ABBA
// order) a liveness watch of `bound` runs over its own store connection, started before the
// block's time and stopped after it.
// Rank 0's figures: the on blocks' steps/s over the off blocks', over all blocks and as the
// median of the pairs' ratios.
nlohmann::json liveness_block_ratio(distributed::ProcessGroup& group, const distributed::ProcessGroupOptions& options,
                                    std::chrono::milliseconds bound, int pairs, int steps,
                                    const std::function<void(int)>& step) {
  // As the group's own watch: a file store is safe to share, a TCP store gets a second connection.
  c10::intrusive_ptr<c10d::Store> store = group.store();
  if (options.store_file().empty()) {
    c10d::TCPStoreOptions store_options;
    store_options.port = static_cast<std::uint16_t>(options.main_port());
    store_options.timeout = options.timeout();
    store_options.isServer = false;
    store_options.waitWorkers = false;
    store = c10::make_intrusive<c10d::TCPStore>(options.main_address(), store_options);
  }
  const int per_block = steps / (2 * pairs);
  double total_seconds[2] = {0, 0}, total_steps[2] = {0, 0};  // off, on
  std::vector<double> ratios;
  int done = 0;
  for (int p = 0; p < pairs; ++p) {
    double per_step[2] = {0, 0};
    for (int k = 0; k < 2; ++k) {
      const bool on = (k == 0) == (p % 2 == 0);
      const int n = p + 1 == pairs && k == 1 ? steps - done : per_block;
      std::unique_ptr<distributed::detail::LivenessWatch> watch;
      if (on) {
        watch = std::make_unique<distributed::detail::LivenessWatch>(
            c10::make_intrusive<c10d::PrefixStore>("bench/block_" + std::to_string(p), store), group.rank(),
            group.world_size(), bound, std::vector<std::string>{}, group.describe(), "the job's store");
      }
      // Time for the watch's threads to start and beat once (every block waits alike): a block
      // then sees the watch as a long run does, beating once a period.
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
      distributed::barrier(group, "block start");
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; i < n; ++i) step(done + i);
      distributed::barrier(group, "block end");
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      per_step[on] = seconds / n;
      total_seconds[on] += seconds;
      total_steps[on] += n;
      done += n;
    }
    ratios.push_back(per_step[0] / per_step[1]);
  }
  return {{"pairs", pairs},
          {"steps_per_block", per_block},
          {"ratio", (total_steps[1] / total_seconds[1]) / (total_steps[0] / total_seconds[0])},
          {"median_ratio", median(ratios)},
          {"min_ratio", *std::min_element(ratios.begin(), ratios.end())},
          {"max_ratio", *std::max_element(ratios.begin(), ratios.end())}};
}

using Clock = std::chrono::steady_clock;
// --profile's parts of a step; the last two split the wait after backward where the ranks share
// one machine's clock: waiting for the last rank to hand over its last bucket (no reduction can
// end before), then the rest.
constexpr int kParts = 6;
const char* const kPartNames[kParts] = {"forward_ms",          "backward_ms",        "reduction_wait_ms",
                                        "optimizer_ms",        "waiting_for_peers_ms", "reduction_after_last_ms"};
struct StepTimes {
  std::array<double, 4> parts;  // the first four of kPartNames
  double autograd_end, last_bucket, backward_end;  // ms on the steady clock
};

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// --profile's figures: per rank, each part's median and mean over the timed steps.
nlohmann::json profile_by_rank(distributed::ProcessGroup& group, const std::vector<StepTimes>& steps, bool one_clock) {
  std::vector<std::vector<double>> parts(kParts);
  for (const auto& t : steps) {
    for (size_t k = 0; k < t.parts.size(); ++k) parts[k].push_back(t.parts[k]);
  }
  const int known = one_clock && group.world_size() > 1 ? kParts : 4;
  if (known == kParts) {
    auto handed = torch::empty({static_cast<int64_t>(steps.size())}, torch::kFloat64);
    for (size_t i = 0; i < steps.size(); ++i) handed[i] = steps[i].last_bucket;
    // Per step, when the last rank handed over its last bucket.
    const auto last = std::get<0>(torch::stack(distributed::all_gather(group, handed)).max(0));
    for (size_t i = 0; i < steps.size(); ++i) {
      const double gate = std::max(steps[i].autograd_end, last[i].item<double>());
      parts[4].push_back(gate - steps[i].autograd_end);
      parts[5].push_back(steps[i].backward_end - gate);
    }
  }
  auto figures = torch::zeros({group.world_size(), kParts, 2}, torch::kFloat64);
  for (int k = 0; k < known; ++k) {
    const auto& v = parts[k];
    figures[group.rank()][k][0] = median(v);
    figures[group.rank()][k][1] = v.empty() ? 0.0 : std::accumulate(v.begin(), v.end(), 0.0) / v.size();
  }
  const auto all = distributed::all_reduce(group, figures, distributed::ReduceOp::sum);
  nlohmann::json out = nlohmann::json::array();
  for (int r = 0; r < group.world_size(); ++r) {
    nlohmann::json rank;
    for (int k = 0; k < known; ++k) {
      rank[kPartNames[k]] = {{"median", all[r][k][0].item<double>()}, {"mean", all[r][k][1].item<double>()}};
    }
    out.push_back(rank);
  }
  return out;
}

double unix_seconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

int run(int argc, char** argv) {
  CLI::App app{"Lockstep DDP throughput", "bench_ddp"};
  std::string model = "small";
  int nproc = 2, steps = 100, warmup = 10;
  int64_t batch = 64;
  double bucket_cap_mb = 25;
  bool view = true;
  std::string start_method = "popen";
  std::string accelerator = "cpu";
  double liveness_timeout = 15;
  app.add_option("--model", model)->check(CLI::IsMember({"small", "25m", "cnn"}));
  app.add_option("--nproc-per-node", nproc)->check(CLI::Range(1, 1024));
  app.add_option("--steps", steps)->check(CLI::Range(1, 1 << 30));
  app.add_option("--warmup", warmup, "untimed steps first, at least 1 (the first is the start-up's end)")
      ->check(CLI::Range(1, 1 << 30));
  app.add_option("--batch", batch, "examples per rank per step");
  app.add_option("--bucket-cap-mb", bucket_cap_mb);
  app.add_option("--gradient-as-bucket-view", view);
  app.add_option("--start-method", start_method, "popen: re-execute for the other ranks; fork: fork them")
      ->check(CLI::IsMember({"popen", "fork"}));
  app.add_option("--accelerator", accelerator, "cpu, or cuda: rank r on GPU r % (GPU count), gradients through Gloo")
      ->check(CLI::IsMember({"cpu", "cuda"}));
  int liveness_blocks = 0;
  bool profile = false, sync_only = false;
  app.add_flag("--sync-only", sync_only,
               "no DDP: after each backward only a 16-float shared-memory all-reduce, the ranks in lock-step "
               "with no gradients exchanged (bench/run section 13)");
  app.add_flag("--profile", profile, "time each part of every timed step on every rank (bench/run section 13)");
  app.add_option("--liveness-timeout", liveness_timeout, "seconds; 0: no liveness watch (bench/run section 12)")
      ->check(CLI::Range(0.0, 1e6));
  app.add_option("--liveness-blocks", liveness_blocks,
                 "N: the timed steps in 2N blocks, a watch with --liveness-timeout in every other one")
      ->check(CLI::Range(0, 1 << 20));
  CLI11_PARSE(app, argc, argv);
  if (liveness_blocks > 0 && (nproc < 2 || liveness_timeout <= 0 || steps < 2 * liveness_blocks)) {
    std::ostringstream got;
    got << nproc << ", " << liveness_timeout << ", " << steps;
    throw UsageError("--liveness-blocks " + std::to_string(liveness_blocks) + " needs --nproc-per-node >= 2, "
                     "--liveness-timeout > 0 and --steps >= 2 x the blocks; got " + got.str() + ".");
  }
  const auto watch_bound = std::chrono::milliseconds(static_cast<int64_t>(liveness_timeout * 1000));
  if (sync_only && (nproc < 2 || accelerator != "cpu" || liveness_blocks > 0)) {
    throw UsageError("--sync-only needs --nproc-per-node >= 2, --accelerator cpu and no --liveness-blocks; got " +
                     std::to_string(nproc) + ", " + accelerator + ", " + std::to_string(liveness_blocks) + ".");
  }
  if (accelerator == "cuda" && !torch::cuda::is_available()) {
    throw UsageError("--accelerator cuda, but this LibTorch sees no CUDA GPU; use --accelerator cpu.");
  }

  auto env = environments::detect_environment(environments::Environ::from_process());
  if (!env->creates_processes_externally() && nproc > 1) {
    const auto options = launchers::LaunchOptions().nproc_per_node(nproc).master_port(env->main_port());
    const auto method = start_method == "fork" ? launchers::StartMethod::fork : launchers::StartMethod::reexec;
    if (const auto placement = launchers::LocalLauncher(options, method).launch()) {
      env = std::make_unique<environments::TorchElasticEnvironment>(*placement);
    }
  }
  torch::set_num_threads(1);
  const auto group_options = env->process_group_options().timeout(std::chrono::seconds(300)).liveness_timeout(
      liveness_blocks > 0 ? std::chrono::milliseconds(0) : watch_bound);
  auto group = distributed::ProcessGroup::init(group_options);
  torch::manual_seed(0);
  auto net = std::make_shared<NetImpl>(model);
  const auto device = accelerator == "cuda"
                          ? torch::Device(torch::kCUDA, static_cast<c10::DeviceIndex>(
                                                            group->rank() % static_cast<int>(torch::cuda::device_count())))
                          : torch::Device(torch::kCPU);
  net->to(device);
  std::unique_ptr<distributed::DistributedDataParallel<NetImpl>> ddp;
  std::shared_ptr<distributed::SharedMemoryAllreduce> lockstep_only;  // --sync-only
  torch::Tensor token;
  if (sync_only) {
    std::string why_not;
    lockstep_only = distributed::SharedMemoryAllreduce::connect(*group, 64, "", &why_not);
    if (!lockstep_only) throw UsageError("--sync-only: no shared memory between the ranks: " + why_not + ".");
    token = lockstep_only->region(0, 16, torch::kFloat32);
  } else {
    ddp = std::make_unique<distributed::DistributedDataParallel<NetImpl>>(
        net, *group, distributed::DDPOptions().bucket_cap_mb(bucket_cap_mb).gradient_as_bucket_view(view));
  }
  torch::optim::SGD optimizer(net->parameters(), torch::optim::SGDOptions(0.01));
  // Each rank's batches: a fixed generator per rank, the same on the Python side.
  auto generator = at::make_generator<at::CPUGeneratorImpl>(1000 + group->rank());
  std::vector<torch::Tensor> xs, ys;
  for (int i = 0; i < 8; ++i) {
    xs.push_back(torch::randn({batch, 784}, generator).to(device));
    ys.push_back(torch::randint(10, {batch}, generator, torch::kInt64).to(device));
  }
  double loss_value = 0;
  std::vector<StepTimes> times;  // --profile: each timed step's
  auto step = [&](int i) {
    const auto start = Clock::now();
    auto loss = torch::nn::functional::cross_entropy(ddp ? ddp->forward(xs[i % 8]) : net->forward(xs[i % 8]),
                                                     ys[i % 8]);
    optimizer.zero_grad();
    const auto forward_end = Clock::now();
    loss.backward();
    const auto autograd_done = Clock::now();
    if (lockstep_only) lockstep_only->allreduce_here(0, token, 1.0);
    const auto backward_end = lockstep_only ? Clock::now() : autograd_done;
    optimizer.step();
    loss_value = loss.item<double>();
    if (profile && i >= warmup) {
      // One rank has no reducer trace: all of backward is autograd's; --sync-only's hand-over is autograd's end.
      auto autograd_end = autograd_done, last_bucket = autograd_done;
      if (ddp && group->world_size() > 1) {
        const auto& trace = ddp->reducer().last_trace();
        const auto at = [&](std::chrono::nanoseconds since) {
          return trace.backward_start + std::chrono::duration_cast<Clock::duration>(since);
        };
        autograd_end = at(trace.backward_end);
        last_bucket = at(trace.buckets.empty() ? trace.backward_end : trace.buckets.back().launched);
        // A last bucket reduced on the backward thread (shared memory's) ends autograd's part at its hand-over.
        if (!trace.buckets.empty() && trace.buckets.back().reduced_in_hook) autograd_end = last_bucket;
      }
      times.push_back({{ms(forward_end - start), ms(autograd_end - forward_end), ms(backward_end - autograd_end),
                        ms(Clock::now() - backward_end)},
                       ms(autograd_end.time_since_epoch()),
                       ms(last_bucket.time_since_epoch()),
                       ms(backward_end.time_since_epoch())});
    }
  };
  step(0);
  const double first_step_unix = unix_seconds();
  for (int i = 1; i < warmup; ++i) step(i);
  distributed::barrier(*group, "timed_start");
  const double watch_start = liveness_cpu_seconds();
  const double cpu_start = process_cpu_seconds(), main_start = thread_cpu_seconds();
  const auto ticks_start = machine_ticks();
  const auto start = std::chrono::steady_clock::now();
  nlohmann::json blocks;
  if (liveness_blocks > 0) {
    blocks = liveness_block_ratio(*group, group_options, watch_bound, liveness_blocks, steps,
                                  [&](int i) { step(warmup + i); });
  } else {
    for (int i = warmup; i < warmup + steps; ++i) step(i);
  }
  distributed::barrier(*group, "timed_end");
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto ticks_end = machine_ticks();
  const auto cpu = distributed::all_reduce(
      *group, torch::tensor({process_cpu_seconds() - cpu_start, thread_cpu_seconds() - main_start}, torch::kFloat64),
      distributed::ReduceOp::sum);
  const double ticks = ticks_end[0] - ticks_start[0];
  const double cpus = static_cast<double>(::sysconf(_SC_NPROCESSORS_ONLN));
  const auto per_step = [&](int k) { return 1000 * cpu[k].item<double>() / (group->world_size() * steps); };
  const nlohmann::json cpu_json = {
      {"ms_per_step", per_step(0)},
      {"main_thread_ms_per_step", per_step(1)},
      {"cpus", cpus},
      {"job_share", cpu[0].item<double>() / (cpus * seconds)},
      {"machine_idle_share", ticks > 0 ? (ticks_end[1] - ticks_start[1]) / ticks : 0.0},
      {"machine_steal_share", ticks > 0 ? (ticks_end[2] - ticks_start[2]) / ticks : 0.0}};
  auto watch_cpu = distributed::all_reduce(
      *group, torch::tensor({liveness_cpu_seconds() - watch_start}, torch::kFloat64), distributed::ReduceOp::sum);
  auto loss = distributed::all_reduce(*group, torch::tensor({loss_value}, torch::kFloat64));
  rusage usage{};
  ::getrusage(RUSAGE_SELF, &usage);  // ru_maxrss: KiB on Linux
  auto rss = torch::zeros({group->world_size()}, torch::kFloat64);
  rss[group->rank()] = static_cast<double>(usage.ru_maxrss) / 1024.0;
  rss = distributed::all_reduce(*group, rss, distributed::ReduceOp::sum);
  const std::string transport = group->world_size() == 1              ? "none (one rank)"
                                : lockstep_only                        ? "--sync-only: 16 floats a step, shared memory"
                                : ddp->why_not_shared_memory().empty() ? ddp->reducer().transport().name()
                                                                       : "gloo: " + ddp->why_not_shared_memory();
  // Every rank's own account (they agree unless something is wrong).
  std::vector<std::string> transports;
  auto transport_bytes = torch::tensor(std::vector<uint8_t>(transport.begin(), transport.end()), torch::kUInt8);
  for (const auto& part : distributed::all_gather(*group, transport_bytes)) {
    transports.emplace_back(static_cast<const char*>(part.data_ptr()), static_cast<size_t>(part.numel()));
  }
  // The steady clock is one per machine: the ranks' ends compare only when they share it.
  const bool one_clock = env->placement().local_world_size == group->world_size();
  const auto profile_json = profile ? profile_by_rank(*group, times, one_clock) : nlohmann::json();
  if (group->rank() == 0) {
    std::cout << nlohmann::json{{"impl", "lockstep"},
                                {"model", model},
                                {"device", device.str()},
                                {"world_size", group->world_size()},
                                {"sync_only", sync_only},
                                {"steps", steps},
                                {"batch", batch},
                                {"steps_per_s", steps / seconds},
                                {"loss", loss.item<double>()},
                                {"first_step_unix", first_step_unix},
                                {"liveness_cpu_share", watch_cpu.item<double>() / (seconds * group->world_size())},
                                {"liveness_blocks", blocks},
                                {"profile", profile_json},
                                {"cpu", cpu_json},
                                {"gradient_transport", transport},
                                {"gradient_transport_by_rank", transports},
                                {"peak_rss_mb", std::vector<double>(rss.data_ptr<double>(),
                                                                    rss.data_ptr<double>() + rss.numel())}}
                     .dump()
              << std::endl;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return lockstep::cli::guarded_main("bench_ddp", [&] { return run(argc, argv); }); }
