// bench/run, the benchmark harness (issue 6): a quick run on this build's programs writes every
// section, with the loss check passed for every model and positive figures. No timing
// assertions: this proves the harness works, not how fast anything is.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <filesystem>
#include <set>

#include "../support/command.h"
#include "../support/paths.h"
#include "../support/temp_dir.h"

namespace lockstep {
namespace {

using testing::run_command;

const std::string bench_run = std::string(LOCKSTEP_SOURCE_DIR) + "/bench/run";
const std::string build_dir = std::filesystem::path(LOCKSTEP_BIN_DIR).parent_path().string();

std::map<std::string, std::string> plain_environment() { return {{"PATH", "/usr/bin:/bin"}, {"HOME", "/tmp"}}; }

void expect_positive(const nlohmann::json& j, const std::string& where) {
  ASSERT_TRUE(j.is_number()) << where << " = " << j.dump();
  EXPECT_GT(j.get<double>(), 0) << where;
}

void expect_ddp_entry(const nlohmann::json& e, int world_size) {
  const std::string name = e.value("model", "?") + " x" + std::to_string(world_size);
  EXPECT_EQ(e["world_size"], world_size) << name;
  EXPECT_TRUE(e["loss_check"]["ok"].get<bool>()) << name << ": " << e["loss_check"].dump();
  for (const char* side : {"lockstep", "pytorch"}) {
    ASSERT_TRUE(e.contains(side)) << name << ": " << e.dump();
    for (const char* key : {"steps_per_s", "samples_per_s", "startup_s", "peak_rss_mb"}) {
      expect_positive(e[side][key], name + " " + side + "." + key);
    }
  }
  expect_positive(e["ratio"], name + " ratio");
}

// A section beside Python ran Lockstep from build-libtorch2 (Python's torch line) when that build
// has `programs`, else from this build, marked as not the same LibTorch.
void expect_same_libtorch_where_built(const nlohmann::json& e, const std::vector<std::string>& programs) {
  const auto libtorch2 = std::filesystem::path(LOCKSTEP_SOURCE_DIR) / "build-libtorch2";
  bool built = true;
  for (const auto& p : programs) built = built && std::filesystem::exists(libtorch2 / "bin" / p);
  const std::filesystem::path ran = e["lockstep_build"].get<std::string>();
  EXPECT_TRUE(std::filesystem::equivalent(ran, built ? libtorch2 : std::filesystem::path(build_dir))) << e.dump();
  EXPECT_EQ(e["unpaired"].get<std::string>().empty(), built) << e.dump();
}

TEST(BenchRun, QuickRunWritesEverySection) {
  testing::TempDir out("bench_run");
  // The quick mode takes about 4 minutes on 2 cores; allow for a loaded machine.
  const auto result = run_command({bench_run, "--quick", "--no-build", "--build-dir", build_dir, "--out", out.path()},
                                  plain_environment(), std::chrono::seconds(320));
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err;
  EXPECT_NE(result.out.find("| Section | Measure |"), std::string::npos) << result.out;
  ASSERT_TRUE(std::filesystem::exists(out / "latest.json")) << result.err;
  EXPECT_TRUE(std::filesystem::exists(out / "benchmarks.md"));
  EXPECT_TRUE(std::filesystem::exists(out / "benchmarks.png"));
  const auto j = nlohmann::json::parse(testing::slurp(out / "latest.json"));
  EXPECT_TRUE(j["ok"].get<bool>());
  EXPECT_EQ(j["meta"]["mode"], "quick");
  for (const char* key : {"date", "machine", "versions"}) EXPECT_TRUE(j["meta"].contains(key)) << key;

  ASSERT_EQ(j["ddp"].size(), 3u);
  std::set<std::string> models;
  for (const auto& e : j["ddp"]) {
    models.insert(e["model"].get<std::string>());
    expect_ddp_entry(e, 2);
    // The 2-rank runs: Lockstep's gradients through shared memory, and its third side through Gloo.
    EXPECT_EQ(e["lockstep"]["gradient_transport"], "shared memory") << e.dump();
    EXPECT_EQ(e["lockstep_gloo"]["gradient_transport"], "gloo: turned off by LOCKSTEP_DDP_SHARED_MEMORY=0 (ranks 0, 1)")
        << e.dump();
    expect_positive(e["gloo_ratio"], "gloo_ratio");
  }
  EXPECT_EQ(models, (std::set<std::string>{"small", "25m", "cnn"}));

  const auto& t = j["trainer_overhead"];
  for (const char* key : {"trainer_s_per_epoch", "loop_s_per_epoch", "ratio"}) expect_positive(t[key], key);
  const auto& f = j["fabric_overhead"];
  for (const char* key : {"fabric_steps_per_s", "plain_steps_per_s", "ratio"}) expect_positive(f[key], key);
  EXPECT_NEAR(f["fabric_last_loss"].get<double>(), f["plain_last_loss"].get<double>(), 1e-5)
      << "the two loops must train alike: " << f.dump();

  const auto& g = j["gradient_sync"];
  EXPECT_TRUE(g["comm_bench"]["correct"].get<bool>());
  for (const char* key : {"reducer_busbw_gbps", "raw_busbw_gbps", "allreduce_busbw_ratio", "reducer_busbw_ratio"}) {
    expect_positive(g[key], key);
  }
  EXPECT_GE(g["hidden_share"].get<double>(), 0.0);
  EXPECT_LE(g["hidden_share"].get<double>(), 1.0);

  expect_positive(j["startup"]["lockstep_s"], "startup lockstep_s");
  expect_positive(j["startup"]["pytorch_s"], "startup pytorch_s");
  expect_positive(j["startup"]["lockstep_fork_s"], "startup lockstep_fork_s");

  ASSERT_EQ(j["peak_rss"].size(), 3u);
  for (const auto& m : j["peak_rss"]) {
    expect_positive(m["lockstep_mb"], "peak_rss lockstep_mb");
    expect_positive(m["pytorch_mb"], "peak_rss pytorch_mb");
  }

  ASSERT_EQ(j["scaling"].size(), 3u);
  const int ranks[] = {1, 2, 4};
  for (size_t i = 0; i < 3; ++i) expect_ddp_entry(j["scaling"][i], ranks[i]);

  // Section 8 where .venv-libtorch2 is installed: both sides trained the same epoch.
  const auto& lightning = j["trainer_vs_lightning"];
  if (!lightning.contains("skipped")) {
    EXPECT_FALSE(lightning.contains("error")) << lightning.dump();
    for (const char* side : {"lockstep", "lightning"}) {
      for (const char* key : {"fit_s", "steps_per_s", "val_acc"}) {
        expect_positive(lightning[side][key], std::string("trainer_vs_lightning ") + side + "." + key);
      }
    }
    expect_same_libtorch_where_built(lightning, {"fashion_mnist"});
  }

  // Section 10, quick: the 24.2M MLP on 2 ranks, Lockstep's DDP and FULL_SHARD (and FSDP2 where
  // .venv-libtorch2 is installed).
  ASSERT_EQ(j["sharded_training"].size(), 1u);
  const auto& s = j["sharded_training"][0];
  EXPECT_EQ(s["model"], "25m");
  EXPECT_EQ(s["world_size"], 2);
  EXPECT_TRUE(s["loss_check"]["ok"].get<bool>()) << s["loss_check"].dump();
  for (const char* side : {"DDP", "FULL_SHARD"}) {
    ASSERT_TRUE(s["sides"].contains(side)) << s.dump();
    for (const char* key : {"steps_per_s", "peak_rss_mb", "floor_rss_mb"}) {
      expect_positive(s["sides"][side][key], std::string("sharded_training ") + side + "." + key);
    }
  }
  const auto& hidden = s["sides"]["FULL_SHARD"]["all_gather_hidden_share"];
  ASSERT_TRUE(hidden.is_number()) << s.dump();
  EXPECT_GE(hidden.get<double>(), 0.0);
  EXPECT_LE(hidden.get<double>(), 1.0);
  EXPECT_EQ(s["sides"].contains("FSDP2"), !s.contains("python_skipped")) << s.dump();
  if (s["sides"].contains("FSDP2")) expect_same_libtorch_where_built(s, {"bench_fsdp", "lockstep"});
  // Where Lockstep ran on build-libtorch2, the memory of DDP and FULL_SHARD again on --build-dir's
  // LibTorch, where the targets were set: sharding saves memory there too.
  const bool elsewhere = !std::filesystem::equivalent(s["lockstep_build"].get<std::string>(), build_dir);
  EXPECT_EQ(s.contains("memory_on_build_dir"), elsewhere) << s.dump();
  if (elsewhere) {
    const auto& again = s["memory_on_build_dir"];
    EXPECT_TRUE(std::filesystem::equivalent(again["build"].get<std::string>(), build_dir)) << again.dump();
    const double ddp = again["sides"]["DDP"]["peak_rss_mb"].get<double>();
    const double full = again["sides"]["FULL_SHARD"]["peak_rss_mb"].get<double>();
    EXPECT_GT(full, again["sides"]["FULL_SHARD"]["floor_rss_mb"].get<double>()) << again.dump();
    EXPECT_LT(full, ddp) << again.dump();
  }

  // Section 11, quick: the 24.2M MLP's checkpoint on 2 ranks in DCP's format, saved and loaded
  // back exactly (and by dcp.save of FSDP2 where .venv-libtorch2 is installed).
  ASSERT_EQ(j["checkpoints"].size(), 1u);
  const auto& c = j["checkpoints"][0];
  EXPECT_FALSE(c.contains("error")) << c.dump();
  EXPECT_EQ(c["world_size"], 2);
  EXPECT_EQ(c["sides"].contains("FSDP2"), !c.contains("python_skipped")) << c.dump();
  expect_same_libtorch_where_built(c, {"bench_checkpoint", "lockstep"});
  for (const auto& [side, v] : c["sides"].items()) {
    EXPECT_TRUE(v["restored"].get<bool>()) << side;
    for (const char* key : {"save_s", "load_s", "peak_train_mb", "checkpoint_mb"}) {
      expect_positive(v[key], "checkpoints " + side + "." + key);
    }
    // Adam's state and the weights, 3 x 24.2M float32: about 290 MB on disk on either side.
    EXPECT_GT(v["checkpoint_mb"].get<double>(), 280) << side;
  }

  // Section 12: the liveness watch on, off and 50x as often, the same final loss.
  const auto& l = j["liveness"];
  EXPECT_FALSE(l.contains("error")) << l.dump();
  expect_positive(l["on_steps_per_s"], "liveness on_steps_per_s");
  expect_positive(l["off_steps_per_s"], "liveness off_steps_per_s");
  expect_positive(l["fast_steps_per_s"], "liveness fast_steps_per_s");
  expect_positive(l["ratio"], "liveness ratio");
  expect_positive(l["fast_ratio"], "liveness fast_ratio");
  // The ratios come from alternating blocks in one run: the median lies within the pairs' spread.
  for (const std::string key : {"", "fast_"}) {
    const auto& spread = l[key + "pair_ratios"];
    EXPECT_LE(spread[0].get<double>(), l[key + "ratio"].get<double>()) << l.dump();
    EXPECT_GE(spread[1].get<double>(), l[key + "ratio"].get<double>()) << l.dump();
    expect_positive(l[key + "total_ratio"], "liveness " + key + "total_ratio");
  }
  // The watch's threads ran, and beating 50x as often they ran more.
  EXPECT_GE(l["cpu_share"].get<double>(), 0.0) << l.dump();
  EXPECT_LT(l["cpu_share"].get<double>(), 0.01) << l.dump();
  EXPECT_GT(l["fast_cpu_share"].get<double>(), l["cpu_share"].get<double>()) << l.dump();

  // Section 13: 2 ranks against two one-rank runs of the same program at once.
  const auto& limit = j["limit"];
  ASSERT_EQ(limit.size(), 2u) << limit.dump();
  for (const auto& e : limit) {
    expect_positive(e["steps_per_s"], "limit steps_per_s");
    expect_positive(e["limit_steps_per_s"], "limit limit_steps_per_s");
    expect_positive(e["ratio"], "limit ratio");
    EXPECT_EQ(e["round_ratios"].size(), 1u) << e.dump();
    // Against the slower run of each pair, never below the ratio against the pair's mean.
    EXPECT_GE(e["slower_ratio"].get<double>(), e["ratio"].get<double>()) << e.dump();
  }
  EXPECT_EQ(limit[0]["side"], "DDP");
  EXPECT_EQ(limit[1]["side"], "FULL_SHARD");
  // Where DDP's steps went, beside the one-rank runs' (which wait for nobody).
  const auto& profile = limit[0]["profile"];
  expect_positive(profile["two_ranks"]["backward_ms"]["mean"], "limit two_ranks backward_ms");
  expect_positive(profile["one_rank_runs"]["backward_ms"]["mean"], "limit one_rank_runs backward_ms");
  EXPECT_EQ(profile["one_rank_runs"]["reduction_wait_ms"]["mean"], 0.0) << profile.dump();
  EXPECT_TRUE(profile["two_ranks"].contains("waiting_for_peers_ms")) << profile.dump();
  EXPECT_FALSE(profile["one_rank_runs"].contains("waiting_for_peers_ms")) << profile.dump();
  // DDP's third side: the same ranks in lock-step with no gradients, and every side's CPU per step.
  expect_positive(limit[0]["lockstep_ratio"], "limit lockstep_ratio");
  EXPECT_EQ(limit[0]["vs_lockstep_round_ratios"].size(), 1u) << limit[0].dump();
  for (const char* side : {"two_ranks", "lockstep", "one_rank_runs"}) {
    expect_positive(limit[0]["cpu_ms_per_step"][side], std::string("limit cpu_ms_per_step ") + side);
    EXPECT_LE(limit[0]["machine_idle_share"][side].get<double>(), 1.0) << limit[0].dump();
  }
  EXPECT_FALSE(limit[1].contains("lockstep_ratio")) << limit[1].dump();

  // Section 14 needs --baseline: without it, skipped by name (BaselineSectionRunsBothBuildsAlike runs it).
  EXPECT_NE(j["baseline"]["skipped"].get<std::string>().find("no --baseline DIR given"), std::string::npos)
      << j["baseline"].dump();
}

// Section 14: this build against an earlier commit's. Here the build under test is its own baseline
// (DIR/build a link to it), so each pair ran the same program: the final losses and val_acc must be
// the same to the last bit, and the LibTorch 2.x line, which DIR lacks, is skipped by name.
TEST(BenchRun, BaselineSectionRunsBothBuildsAlike) {
  testing::TempDir dir("bench_baseline");
  std::filesystem::create_directory_symlink(build_dir, dir / "build");
  const auto result = run_command({bench_run, "--quick", "--no-build", "--build-dir", build_dir, "--only", "baseline",
                                   "--baseline", dir.path()},
                                  plain_environment(), std::chrono::seconds(240));
  ASSERT_EQ(result.exit_code, 0) << result.out << result.err;
  std::vector<std::string> rows;
  for (const auto& line : result.out_lines()) {
    if (line.rfind("| 14 Against a baseline |", 0) == 0) rows.push_back(line);
  }
  // Quick: the small and the 24.2M MLP's DDP, the main job's steps/s and wall time, the Trainer's
  // epoch, the 2.x line.
  ASSERT_EQ(rows.size(), 6u) << result.out;
  const char* same[] = {"the same final loss; 1 pair,", "the same final loss; 1 pair,", "the same final val_acc; 1 pair,",
                        "the same final val_acc; 1 pair,", "the same final trainer_last_loss; 1 pair,"};
  for (size_t i = 0; i < 5; ++i) EXPECT_NE(rows[i].find(same[i]), std::string::npos) << rows[i];
  EXPECT_NE(rows[2].find("steps/s in fit()"), std::string::npos) << rows[2];
  EXPECT_NE(rows[4].find("s per epoch (section 2's, 1 process)"), std::string::npos) << rows[4];
  EXPECT_NE(rows[5].find("(LibTorch 2.x) | 2 | — | — | — |  | skipped: "), std::string::npos) << rows[5];
  EXPECT_NE(rows[5].find(dir / "build-libtorch2/bin/bench_ddp"), std::string::npos) << rows[5];
}

TEST(BenchRun, BadInputIsOneMessageAndExitTwo) {
  for (const auto& args : std::vector<std::vector<std::string>>{{"--pairs", "0"}, {"--frobnicate"}, {"--pairs", "x"},
                                                                {"--only", "baseline"}, {"--baseline", "/nonexistent"}}) {
    std::vector<std::string> argv{bench_run, "--no-build", "--build-dir", build_dir};
    argv.insert(argv.end(), args.begin(), args.end());
    const auto result = run_command(argv, plain_environment(), std::chrono::seconds(30));
    EXPECT_EQ(result.exit_code, 2) << args[0] << ": " << result.err;
    EXPECT_EQ(result.err.find("Traceback"), std::string::npos) << result.err;
    EXPECT_NE(result.err.find("bench/run: error: "), std::string::npos) << result.err;
    EXPECT_TRUE(result.out.empty()) << result.out;
  }
}

// bench_ddp --profile: every rank's parts of a step; where the ranks share a clock the wait after
// backward splits, step by step, into waiting for the last rank's last bucket and the rest, both
// never negative, so the means add up; and rank 0's parts fit in the time its steps took.
TEST(BenchRun, BenchDdpProfileAccountsForEachRanksSteps) {
  const int steps = 20;
  const auto result = run_command({std::string(LOCKSTEP_BIN_DIR) + "/bench_ddp", "--nproc-per-node", "2", "--steps",
                                   std::to_string(steps), "--warmup", "2", "--profile"},
                                  plain_environment(), std::chrono::seconds(120));
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const auto j = nlohmann::json::parse(result.out_lines().back());
  ASSERT_EQ(j["profile"].size(), 2u) << j.dump();
  for (const auto& rank : j["profile"]) {
    const auto mean = [&](const char* part) { return rank[part]["mean"].get<double>(); };
    EXPECT_NEAR(mean("reduction_wait_ms"), mean("waiting_for_peers_ms") + mean("reduction_after_last_ms"), 1e-3)
        << rank.dump();
    EXPECT_GE(mean("waiting_for_peers_ms"), 0.0) << rank.dump();
    EXPECT_GE(mean("reduction_after_last_ms"), 0.0) << rank.dump();
    expect_positive(rank["forward_ms"]["mean"], "forward_ms");
    expect_positive(rank["backward_ms"]["mean"], "backward_ms");
  }
  // steps_per_s is rank 0's, timed between barriers around its steps.
  const auto& zero = j["profile"][0];
  double parts = 0;
  for (const char* part : {"forward_ms", "backward_ms", "reduction_wait_ms", "optimizer_ms"}) {
    parts += zero[part]["mean"].get<double>();
  }
  EXPECT_LE(parts * steps / 1000.0, steps / j["steps_per_s"].get<double>()) << zero.dump();
}

// bench_ddp --sync-only: the ranks wait for each other after every backward, on DDP's shared
// memory, but exchange no gradients, so their weights part and the final loss is not DDP's; every
// run says its CPU time per step (the main thread's within the process's) and the machine's idle share.
TEST(BenchRun, BenchDdpSyncOnlyKeepsTheRanksInStepWithoutGradients) {
  const auto bench = [](const std::vector<std::string>& extra) {
    std::vector<std::string> argv{std::string(LOCKSTEP_BIN_DIR) + "/bench_ddp", "--nproc-per-node", "2", "--steps",
                                  "20", "--warmup", "2"};
    argv.insert(argv.end(), extra.begin(), extra.end());
    const auto result = run_command(argv, plain_environment(), std::chrono::seconds(120));
    EXPECT_EQ(result.exit_code, 0) << result.err;
    return nlohmann::json::parse(result.out_lines().back());
  };
  const auto ddp = bench({});
  const auto in_step = bench({"--sync-only", "--profile"});
  EXPECT_FALSE(ddp["sync_only"].get<bool>());
  EXPECT_TRUE(in_step["sync_only"].get<bool>());
  EXPECT_EQ(in_step["gradient_transport"], "--sync-only: 16 floats a step, shared memory") << in_step.dump();
  EXPECT_GT(std::abs(in_step["loss"].get<double>() - ddp["loss"].get<double>()), 1e-6) << in_step.dump();
  for (const auto& rank : in_step["profile"]) expect_positive(rank["reduction_wait_ms"]["mean"], "the wait in step");
  for (const auto& j : {ddp, in_step}) {
    const auto& cpu = j["cpu"];
    expect_positive(cpu["ms_per_step"], "cpu ms_per_step");
    expect_positive(cpu["main_thread_ms_per_step"], "cpu main_thread_ms_per_step");
    EXPECT_LE(cpu["main_thread_ms_per_step"].get<double>(), cpu["ms_per_step"].get<double>() + 1e-3) << cpu.dump();
    EXPECT_LE(cpu["job_share"].get<double>(), 1.05) << cpu.dump();
    for (const char* share : {"machine_idle_share", "machine_steal_share"}) {
      EXPECT_GE(cpu[share].get<double>(), 0.0) << cpu.dump();
      EXPECT_LE(cpu[share].get<double>(), 1.0) << cpu.dump();
    }
  }
  const auto one_rank = run_command({std::string(LOCKSTEP_BIN_DIR) + "/bench_ddp", "--sync-only",
                                     "--nproc-per-node", "1"},
                                    plain_environment(), std::chrono::seconds(30));
  EXPECT_EQ(one_rank.exit_code, 2) << one_rank.err;
  EXPECT_NE(one_rank.err.find("--sync-only needs --nproc-per-node >= 2"), std::string::npos) << one_rank.err;
}

// bench_ddp --liveness-blocks needs a watch to alternate and two ranks to watch: else one message.
TEST(BenchRun, BenchDdpRefusesLivenessBlocksItCannotRun) {
  const std::string bench_ddp = std::string(LOCKSTEP_BIN_DIR) + "/bench_ddp";
  for (const auto& args : std::vector<std::vector<std::string>>{
           {"--liveness-timeout", "0"}, {"--nproc-per-node", "1"}, {"--steps", "3"}}) {
    std::vector<std::string> argv{bench_ddp, "--liveness-blocks", "2"};
    argv.insert(argv.end(), args.begin(), args.end());
    const auto result = run_command(argv, plain_environment(), std::chrono::seconds(30));
    EXPECT_EQ(result.exit_code, 2) << args[0] << ": " << result.err;
    EXPECT_NE(result.err.find("--liveness-blocks 2 needs"), std::string::npos) << result.err;
  }
}

}  // namespace
}  // namespace lockstep
