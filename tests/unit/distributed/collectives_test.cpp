#include <lockstep/distributed/collectives.h>

#include <atomic>
#include <cstdlib>
#include <functional>
#include <thread>

#include <gtest/gtest.h>

#include <lockstep/core/error.h>
#include <torch/torch.h>

#include "../../support/errors.h"
#include "../../support/thread_ranks.h"

namespace lockstep {
namespace distributed {
namespace {

using testing::run_ranks;

class Collectives : public ::testing::TestWithParam<int> {};

TEST_P(Collectives, AllReduceEveryOp) {
  const int n = GetParam();
  run_ranks(n, [n](ProcessGroup& g) {
    const float r = static_cast<float>(g.rank());
    auto sum = all_reduce(g, torch::tensor({r + 1, 2 * r}), ReduceOp::sum);
    EXPECT_FLOAT_EQ(sum[0].item<float>(), n * (n + 1) / 2.0f) << "rank " << g.rank();
    EXPECT_FLOAT_EQ(sum[1].item<float>(), n * (n - 1.0f)) << "rank " << g.rank();
    auto mean = all_reduce(g, torch::tensor({r}));
    EXPECT_FLOAT_EQ(mean.item<float>(), (n - 1) / 2.0f);
    EXPECT_FLOAT_EQ(all_reduce(g, torch::tensor({r}), ReduceOp::max).item<float>(), n - 1.0f);
    EXPECT_FLOAT_EQ(all_reduce(g, torch::tensor({r}), ReduceOp::min).item<float>(), 0.0f);
    auto product = all_reduce(g, torch::tensor({r + 1}), ReduceOp::product);
    float factorial = 1;
    for (int i = 1; i <= n; ++i) factorial *= i;
    EXPECT_FLOAT_EQ(product.item<float>(), factorial);
    auto ints = all_reduce(g, torch::tensor({int64_t{3}}), ReduceOp::sum);
    EXPECT_EQ(ints.item<int64_t>(), 3 * n);
  });
}

TEST_P(Collectives, AllReduceIsInPlace) {
  run_ranks(GetParam(), [](ProcessGroup& g) {
    auto t = torch::ones({4});
    auto out = all_reduce(g, t, ReduceOp::sum);
    EXPECT_EQ(out.data_ptr(), t.data_ptr());
    EXPECT_FLOAT_EQ(t[3].item<float>(), static_cast<float>(g.world_size()));
  });
}

TEST_P(Collectives, AllGatherEqualAndUnevenShapes) {
  const int n = GetParam();
  run_ranks(n, [n](ProcessGroup& g) {
    auto stacked = all_gather_stacked(g, torch::full({2, 3}, static_cast<float>(g.rank())));
    ASSERT_EQ(stacked.sizes(), (std::vector<int64_t>{n, 2, 3}));
    for (int r = 0; r < n; ++r) EXPECT_TRUE(stacked[r].eq(r).all().item<bool>()) << "slot " << r;
    // Rank r contributes r+1 rows of 2 columns.
    auto mine = torch::arange((g.rank() + 1) * 2, torch::kFloat32).reshape({g.rank() + 1, 2}) + 100 * g.rank();
    auto parts = all_gather(g, mine);
    ASSERT_EQ(static_cast<int>(parts.size()), n);
    for (int r = 0; r < n; ++r) {
      auto expected = torch::arange((r + 1) * 2, torch::kFloat32).reshape({r + 1, 2}) + 100 * r;
      EXPECT_TRUE(parts[r].equal(expected)) << "rank " << g.rank() << " part " << r << ": " << parts[r];
    }
    auto scalars = all_gather(g, torch::tensor(static_cast<double>(g.rank())));
    for (int r = 0; r < n; ++r) EXPECT_EQ(scalars[r].item<double>(), r);
  });
}

TEST_P(Collectives, AllGatherOfEmptyTensors) {
  const int n = GetParam();
  run_ranks(n, [n](ProcessGroup& g) {
    // Gloo's own allgather divides by zero here; the collective must not reach it.
    auto parts = all_gather(g, torch::empty({0, 3}));
    ASSERT_EQ(static_cast<int>(parts.size()), n);
    for (const auto& part : parts) EXPECT_EQ(part.sizes(), (std::vector<int64_t>{0, 3}));
    // Some ranks empty, others not.
    auto mixed = all_gather(g, torch::full({g.rank() % 2}, static_cast<float>(g.rank())));
    for (int r = 0; r < n; ++r) EXPECT_EQ(mixed[r].numel(), r % 2) << "part " << r;
  });
}

TEST_P(Collectives, AllGatherRejectsMismatchedDims) {
  std::atomic<int> errors{0};
  EXPECT_NO_THROW(run_ranks(GetParam(), [&](ProcessGroup& g) {
    auto t = g.rank() == 0 ? torch::zeros({2, 3}) : torch::zeros({2, 4});
    try {
      all_gather(g, t);
    } catch (const DistributedError& e) {
      EXPECT_NE(std::string(e.what()).find("beyond the first dimension differ"), std::string::npos) << e.what();
      ++errors;
    }
  }));
  EXPECT_EQ(errors.load(), GetParam());
}

TEST_P(Collectives, BroadcastObjects) {
  run_ranks(GetParam(), [](ProcessGroup& g) {
    const bool root = g.rank() == 1;
    c10::impl::GenericDict value(c10::StringType::get(), c10::AnyType::get());
    if (root) {
      value.insert("name", std::string("lockstep"));
      value.insert("epoch", int64_t{7});
      value.insert("lr", 0.125);
      value.insert("weights", torch::arange(5, torch::kFloat32));
      value.insert("steps", c10::List<int64_t>({1, 2, 3}));
    }
    auto got = broadcast(g, root ? c10::IValue(value) : c10::IValue(), 1).toGenericDict();
    EXPECT_EQ(got.at("name").toStringRef(), "lockstep");
    EXPECT_EQ(got.at("epoch").toInt(), 7);
    EXPECT_DOUBLE_EQ(got.at("lr").toDouble(), 0.125);
    EXPECT_TRUE(got.at("weights").toTensor().equal(torch::arange(5, torch::kFloat32)));
    EXPECT_EQ(got.at("steps").toIntVector(), (std::vector<int64_t>{1, 2, 3}));
    auto text = broadcast(g, c10::IValue(std::string(g.rank() == 0 ? "from zero" : "other")), 0);
    EXPECT_EQ(text.toStringRef(), "from zero");
    nlohmann::json j = g.rank() == 0 ? nlohmann::json{{"a", {1, 2}}, {"b", "c"}} : nlohmann::json();
    auto got_json = broadcast_json(g, j, 0);
    EXPECT_EQ(got_json["a"][1], 2);
    EXPECT_EQ(got_json["b"], "c");
  });
}

TEST_P(Collectives, ReduceBooleanDecision) {
  run_ranks(GetParam(), [](ProcessGroup& g) {
    const bool only_last = g.rank() == g.world_size() - 1;
    EXPECT_FALSE(reduce_boolean_decision(g, only_last, Decision::all));
    EXPECT_TRUE(reduce_boolean_decision(g, only_last, Decision::any));
    EXPECT_TRUE(reduce_boolean_decision(g, true, Decision::all));
    EXPECT_FALSE(reduce_boolean_decision(g, false, Decision::any));
  });
}

TEST_P(Collectives, NamedBarriersRepeat) {
  std::atomic<int> passed{0};
  run_ranks(GetParam(), [&](ProcessGroup& g) {
    for (int i = 0; i < 3; ++i) barrier(g, "epoch_end");
    barrier(g, "checkpoint");
    ++passed;
  });
  EXPECT_EQ(passed.load(), GetParam());
}

TEST_P(Collectives, BarrierTimeoutNamesMissingRank) {
  const int n = GetParam();
  std::vector<std::string> messages(n);
  ::testing::internal::CaptureStderr();
  run_ranks(n, [&](ProcessGroup& g) {
    if (g.rank() == n - 1) return;  // the last rank never arrives
    try {
      barrier(g, "save_checkpoint", CollectiveOptions().timeout(std::chrono::milliseconds(400)));
      ADD_FAILURE() << "rank " << g.rank() << " passed a barrier that a rank never reached";
    } catch (const DistributedError& e) {
      messages[g.rank()] = e.what();
    }
  });
  // A quarter of the timeout in, each waiting rank said who was missing.
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  for (int r = 0; r < n - 1; ++r) {
    const auto at = warnings.find("rank " + std::to_string(r) + "/" + std::to_string(n) +
                                  ": still waiting in barrier 'save_checkpoint' (#0) after 0.1 s: rank(s) ");
    ASSERT_NE(at, std::string::npos) << warnings;
    // The missing rank ends the list (a rank that started late may precede it).
    const std::string line = warnings.substr(at, warnings.find('\n', at) - at);
    EXPECT_NE(line.find(std::to_string(n - 1) + " have not arrived"), std::string::npos) << line;
  }
  for (int r = 0; r < n - 1; ++r) {
    EXPECT_NE(messages[r].find("barrier 'save_checkpoint'"), std::string::npos) << messages[r];
    EXPECT_NE(messages[r].find("rank(s) " + std::to_string(n - 1) + " did not arrive"), std::string::npos)
        << messages[r];
    EXPECT_NE(messages[r].find("rank " + std::to_string(r) + "/"), std::string::npos) << messages[r];
  }
}

TEST_P(Collectives, AllReduceTimeoutNamesOperation) {
  const int n = GetParam();
  std::vector<std::string> messages(n);
  ::testing::internal::CaptureStderr();
  run_ranks(n, [&](ProcessGroup& g) {
    if (g.rank() == 0) {  // rank 0 never joins, and stays until the others gave up
      std::this_thread::sleep_for(std::chrono::milliseconds(700));
      return;
    }
    try {
      all_reduce(g, torch::ones({3}), ReduceOp::sum,
                 CollectiveOptions().tag("sync_dist val_loss").timeout(std::chrono::milliseconds(300)));
      ADD_FAILURE() << "all_reduce completed without rank 0";
    } catch (const DistributedError& e) {
      messages[g.rank()] = e.what();
    }
  }, std::chrono::milliseconds(2000));
  // A quarter of the timeout in, each waiting rank said what it waits in.
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  for (int r = 1; r < n; ++r) {
    EXPECT_NE(warnings.find("rank " + std::to_string(r) + "/" + std::to_string(n) + ": still waiting in all_reduce(sum) "
                            "'sync_dist val_loss' after 0.075 s; a rank has not arrived"),
              std::string::npos) << warnings;
  }
  for (int r = 1; r < n; ++r) {
    EXPECT_NE(messages[r].find("all_reduce(sum) 'sync_dist val_loss'"), std::string::npos) << messages[r];
    EXPECT_NE(messages[r].find("rank " + std::to_string(r) + "/" + std::to_string(n)), std::string::npos)
        << messages[r];
  }
}

TEST_P(Collectives, Subgroups) {
  const int n = GetParam();
  run_ranks(n, [n](ProcessGroup& g) {
    std::vector<int> evens;
    for (int r = 0; r < n; r += 2) evens.push_back(r);
    auto sub = g.new_subgroup(evens);
    if (g.rank() % 2 == 1) {
      EXPECT_EQ(sub, nullptr);
      return;
    }
    ASSERT_NE(sub, nullptr);
    EXPECT_EQ(sub->world_size(), static_cast<int>(evens.size()));
    EXPECT_EQ(sub->rank(), g.rank() / 2);
    auto sum = all_reduce(*sub, torch::tensor({static_cast<float>(g.rank())}), ReduceOp::sum);
    float expected = 0;
    for (int r : evens) expected += r;
    EXPECT_FLOAT_EQ(sum.item<float>(), expected);
    barrier(*sub, "evens");
  });
}

// Runs body(group) on n thread ranks whose group compares every collective across ranks.
void run_checked_ranks(int n, const std::function<void(ProcessGroup&)>& body) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  testing::run_threads(n, [&](int rank) {
    auto group = ProcessGroup::init_with_store(
        store, ProcessGroupOptions(rank, n).timeout(std::chrono::seconds(20)).check_collectives(true));
    body(*group);
  });
}

// LOCKSTEP_DISTRIBUTED_DEBUG=detail (check_collectives): calls that agree run as before; the first
// that differs is an error on every rank naming both calls and their number, not a timeout.
TEST_P(Collectives, CheckedCollectivesThatDifferAreNamedOnEveryRank) {
  const int n = GetParam();
  std::vector<std::string> messages(n);
  run_checked_ranks(n, [&](ProcessGroup& g) {
    const int rank = g.rank();
    ASSERT_TRUE(g.checks_collectives());
    EXPECT_FLOAT_EQ(all_reduce(g, torch::ones({3}), ReduceOp::sum, CollectiveOptions().tag("train_loss"))[0].item<float>(),
                    static_cast<float>(n));
    EXPECT_EQ(all_gather(g, torch::zeros({rank + 1, 2})).size(), static_cast<size_t>(n));  // uneven rows agree
    EXPECT_EQ(broadcast(g, c10::IValue(std::string(rank == 0 ? "zero" : "other")), 0).toStringRef(), "zero");
    barrier(g, "epoch_end");
    try {
      if (rank == 1) {
        barrier(g, "save_checkpoint");
      } else {
        all_reduce(g, torch::ones({1}), ReduceOp::mean, CollectiveOptions().tag("val_loss"));
      }
      ADD_FAILURE() << "rank " << rank << " ran a collective that the others did not";
    } catch (const DistributedError& e) {
      messages[rank] = e.what();
    }
  });
  const std::string val_loss = " is in all_reduce(mean) 'val_loss' of Float [1] #5";
  const std::string checkpoint = " is in barrier('save_checkpoint') #5";
  EXPECT_NE(messages[1].find("collectives differ: rank 0" + val_loss + " while rank 1" + checkpoint), std::string::npos)
      << messages[1];
  for (int r = 0; r < n; ++r) {
    if (r == 1) continue;
    EXPECT_NE(messages[r].find("collectives differ: rank 1" + checkpoint + " while rank " + std::to_string(r) + val_loss),
              std::string::npos) << messages[r];
  }
}

// Under InferenceMode (the Trainer's evaluation, --inference-mode true): Gloo copies a gathered
// tensor into its buffer from its own thread, where the mode does not reach, so the buffers must
// be ordinary tensors; with the calls checked too. The tensors given are inference tensors.
TEST_P(Collectives, CollectivesRunUnderInferenceMode) {
  const int n = GetParam();
  for (const bool checked : {false, true}) {
    const auto body = [n](ProcessGroup& g) {
      c10::InferenceMode inference;
      const auto mine = torch::full({g.rank() + 1, 2}, static_cast<float>(g.rank()));
      ASSERT_TRUE(mine.is_inference());
      const auto parts = all_gather(g, mine);
      ASSERT_EQ(static_cast<int>(parts.size()), n);
      for (int r = 0; r < n; ++r) EXPECT_TRUE(parts[r].equal(torch::full({r + 1, 2}, static_cast<float>(r))));
      EXPECT_FLOAT_EQ(all_reduce(g, torch::ones({2}), ReduceOp::sum)[1].item<float>(), static_cast<float>(n));
      EXPECT_EQ(broadcast(g, c10::IValue(int64_t{g.rank() + 7}), 0).toInt(), 7);
    };
    if (checked) {
      run_checked_ranks(n, body);
    } else {
      run_ranks(n, body);
    }
  }
}

TEST_P(Collectives, CheckedCollectivesWithOtherShapesDiffer) {
  const int n = GetParam();
  std::vector<std::string> messages(n);
  run_checked_ranks(n, [&](ProcessGroup& g) {
    const int rank = g.rank();
    try {
      all_reduce(g, torch::ones({rank == n - 1 ? 2 : 3}), ReduceOp::sum);
      ADD_FAILURE() << "rank " << rank << " reduced tensors of different shapes";
    } catch (const DistributedError& e) {
      messages[rank] = e.what();
    }
  });
  const std::string last = std::to_string(n - 1);
  EXPECT_NE(messages[0].find("rank " + last + " is in all_reduce(sum) of Float [2] #1 while rank 0 is in "
                             "all_reduce(sum) of Float [3] #1"), std::string::npos) << messages[0];
  EXPECT_NE(messages[n - 1].find("rank 0 is in all_reduce(sum) of Float [3] #1 while rank " + last), std::string::npos)
      << messages[n - 1];
}

// Checked, a rank that waits long also says which ranks arrived at the call (from the store).
TEST_P(Collectives, ACheckedCollectiveThatWaitsLongNamesWhoArrived) {
  const int n = GetParam();
  ::testing::internal::CaptureStderr();
  run_checked_ranks(n, [&](ProcessGroup& g) {
    if (g.rank() == 0) {  // rank 0 never joins, and stays until the others gave up
      std::this_thread::sleep_for(std::chrono::milliseconds(800));
      return;
    }
    EXPECT_THROW(all_reduce(g, torch::ones({1}), ReduceOp::sum, CollectiveOptions().timeout(std::chrono::milliseconds(400))),
                 DistributedError);
  });
  const std::string warnings = ::testing::internal::GetCapturedStderr();
  // Rank 0 is missing; rank 1 itself arrived (the others too, unless they started late).
  const std::string line = "rank 1/" + std::to_string(n) + ": still waiting in the check of collective #1 "
                           "(all_reduce(sum) of Float [1]) after 0.1 s; rank(s) 0";
  const auto at = warnings.find(line);
  ASSERT_NE(at, std::string::npos) << warnings;
  EXPECT_NE(warnings.find("have not arrived (rank(s) 1", at), std::string::npos) << warnings;
}

// Parts of ceil(numel / world_size): the last ranks' shorter or empty (10 values on 4 ranks:
// 3, 3, 3, 1; 5 values: 2, 2, 1, 0); all_gather_into puts them back together.
TEST_P(Collectives, ReduceScatterPartsAreUnevenAtTheEnd) {
  const int n = GetParam();
  run_ranks(n, [n](ProcessGroup& g) {
    for (int64_t numel : {1, 5, 10, 16}) {
      for (auto dtype : {torch::kFloat, torch::kDouble}) {
        const auto base = torch::arange(numel, dtype);
        const auto sum = base * (n * (n + 1) / 2);  // rank r gives base * (r + 1)
        const int64_t part = (numel + n - 1) / n;
        const int64_t begin = std::min(numel, g.rank() * part);
        const int64_t length = std::min(numel, begin + part) - begin;
        auto summed = reduce_scatter(g, base * (g.rank() + 1), ReduceOp::sum);
        ASSERT_EQ(summed.numel(), length) << "rank " << g.rank() << ", numel " << numel;
        EXPECT_TRUE(summed.equal(sum.narrow(0, begin, length))) << "rank " << g.rank() << ": " << summed;
        auto mean = reduce_scatter(g, base * (g.rank() + 1));
        EXPECT_TRUE(mean.allclose(sum.narrow(0, begin, length) / n)) << "rank " << g.rank() << ": " << mean;
        auto whole = torch::full({numel}, -1.0, dtype);
        auto returned = all_gather_into(g, summed, whole);
        EXPECT_EQ(returned.data_ptr(), whole.data_ptr());
        EXPECT_TRUE(whole.equal(sum)) << "rank " << g.rank() << ": " << whole;
      }
    }
  });
}

TEST_P(Collectives, ReduceScatterAndAllGatherIntoRejectBadInput) {
  run_ranks(GetParam(), [](ProcessGroup& g) {
    const auto max = testing::error_of<UsageError>([&] { reduce_scatter(g, torch::ones({4}), ReduceOp::max); });
    EXPECT_NE(max.find("reduce_scatter(max): reduce_scatter takes ReduceOp::sum or ReduceOp::mean"), std::string::npos)
        << max;
    EXPECT_THROW(reduce_scatter(g, torch::ones({4}, torch::kInt64)), UsageError);  // the mean of integers
    const auto wrong = testing::error_of<UsageError>([&] { all_gather_into(g, torch::ones({3}), torch::empty({4})); });
    EXPECT_NE(wrong.find("all_gather_into: this rank's part of 4 elements over"), std::string::npos) << wrong;
  });
}

// Checked, ranks that reduce-scatter flats of different sizes are named before any data moves.
TEST_P(Collectives, CheckedReduceScattersOfOtherSizesDiffer) {
  const int n = GetParam();
  std::vector<std::string> messages(n);
  run_checked_ranks(n, [&](ProcessGroup& g) {
    messages[g.rank()] = testing::error_of<DistributedError>(
        [&] { reduce_scatter(g, torch::ones({g.rank() == 0 ? 6 : 8}), ReduceOp::sum); });
  });
  EXPECT_NE(messages[0].find("is in reduce_scatter(sum) of Float [8] #1 while rank 0 is in reduce_scatter(sum) of "
                             "Float [6] #1"), std::string::npos) << messages[0];
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, Collectives, ::testing::Values(2, 4),
                         [](const auto& info) { return "ranks" + std::to_string(info.param); });

TEST(ReduceOps, ParseNamesAndRejectUnknown) {
  EXPECT_EQ(parse_reduce_op("mean"), ReduceOp::mean);
  EXPECT_EQ(parse_reduce_op("avg"), ReduceOp::mean);
  EXPECT_EQ(parse_reduce_op("product"), ReduceOp::product);
  try {
    parse_reduce_op("median");
    FAIL() << "median accepted";
  } catch (const UsageError& e) {
    EXPECT_NE(std::string(e.what()).find("sum, mean, max, min or product"), std::string::npos);
  }
}

TEST(ReduceOps, MeanOfIntegersIsRejected) {
  EXPECT_THROW(run_ranks(2, [](ProcessGroup& g) { all_reduce(g, torch::tensor({int64_t{1}})); }),
               UsageError);
}

// LOCKSTEP_DISTRIBUTED_DEBUG turns the check on (detail, any case) or leaves it off; other values
// are refused before the rendezvous.
TEST(ProcessGroupOptions, DistributedDebugComesFromTheEnvironment) {
  const auto checks = [](const char* value) {
    ::setenv("LOCKSTEP_DISTRIBUTED_DEBUG", value, 1);
    auto group = ProcessGroup::init_with_store(c10::make_intrusive<c10d::HashStore>(), ProcessGroupOptions(0, 1));
    ::unsetenv("LOCKSTEP_DISTRIBUTED_DEBUG");
    return group->checks_collectives();
  };
  EXPECT_TRUE(checks("detail"));
  EXPECT_TRUE(checks("DETAIL"));
  EXPECT_FALSE(checks("off"));
  EXPECT_FALSE(checks(""));
  try {
    checks("verbose");
    ADD_FAILURE() << "LOCKSTEP_DISTRIBUTED_DEBUG=verbose was taken";
  } catch (const UsageError& e) {
    ::unsetenv("LOCKSTEP_DISTRIBUTED_DEBUG");
    EXPECT_NE(std::string(e.what()).find("LOCKSTEP_DISTRIBUTED_DEBUG=verbose is not known: use detail (compare every "
                                         "collective across ranks) or off."), std::string::npos) << e.what();
  }
  auto group = ProcessGroup::init_with_store(c10::make_intrusive<c10d::HashStore>(), ProcessGroupOptions(0, 1));
  EXPECT_FALSE(group->checks_collectives()) << "on by default";
}

TEST(ProcessGroupOptions, BadValuesAreClearErrors) {
  auto store = c10::make_intrusive<c10d::HashStore>();
  auto expect_error = [&](const ProcessGroupOptions& o, const std::string& needle) {
    try {
      ProcessGroup::init_with_store(store, o);
      ADD_FAILURE() << "accepted, expected: " << needle;
    } catch (const DistributedError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(ProcessGroupOptions(2, 2), "rank=2 is outside");
  expect_error(ProcessGroupOptions(0, 0), "world_size=0");
  expect_error(ProcessGroupOptions(0, 1).backend("nccl"), "--process-group-backend gloo");
  expect_error(ProcessGroupOptions(0, 1).backend("mpi"), "not available");
  expect_error(ProcessGroupOptions(0, 1).main_port(70000), "main_port=70000");
}

}  // namespace
}  // namespace distributed
}  // namespace lockstep
