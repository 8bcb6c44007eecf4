#include <lockstep/accelerators/device_parser.h>

#include <stdlib.h>

#include <cstdlib>
#include <map>
#include <set>
#include <string>

#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <lockstep/core/error.h>
#include "../../support/errors.h"
#include "../../support/fake_gpus.h"

namespace lockstep {
namespace accelerators {
namespace {

using testing::error_of;

TEST(ParseAccelerator, ResolvesNamesAgainstTheDeviceCount) {
  EXPECT_EQ(parse_accelerator("auto", 0), Accelerator::cpu);
  EXPECT_EQ(parse_accelerator("auto", 2), Accelerator::cuda);
  EXPECT_EQ(parse_accelerator("CPU", 2), Accelerator::cpu);
  EXPECT_EQ(parse_accelerator("gpu", 1), Accelerator::cuda);
  EXPECT_EQ(parse_accelerator("cuda", 1), Accelerator::cuda);
  EXPECT_EQ(to_string(Accelerator::cuda), "cuda");
  EXPECT_EQ(to_string(Accelerator::cpu), "cpu");
}

TEST(ParseAccelerator, ErrorsNameTheFix) {
  EXPECT_NE(error_of([] { parse_accelerator("cuda", 0); }).find("--accelerator cpu"), std::string::npos);
  EXPECT_NE(error_of([] { parse_accelerator("gpu", 0); }).find("CPU build"), std::string::npos);
  for (const char* name : {"tpu", "mps", "ipu", "hpu"}) {
    EXPECT_NE(error_of([&] { parse_accelerator(name, 0); }).find("does not apply to LibTorch"), std::string::npos)
        << name;
  }
  EXPECT_NE(error_of([] { parse_accelerator("ddp2", 0); }).find("--strategy ddp"), std::string::npos);
  EXPECT_NE(error_of([] { parse_accelerator("horovod", 0); }).find("--strategy ddp"), std::string::npos);
  EXPECT_NE(error_of([] { parse_accelerator("fpga", 0); }).find("'fpga' is unknown"), std::string::npos);
}

TEST(ParseCpuDevices, CountsProcesses) {
  EXPECT_EQ(parse_cpu_devices("auto"), 1);
  EXPECT_EQ(parse_cpu_devices("1"), 1);
  EXPECT_EQ(parse_cpu_devices(" 4 "), 4);
  EXPECT_NE(error_of([] { parse_cpu_devices("0"); }).find("at least 1"), std::string::npos);
  EXPECT_NE(error_of([] { parse_cpu_devices("-1"); }).find("at least 1"), std::string::npos);
  EXPECT_NE(error_of([] { parse_cpu_devices("0,1"); }).find("--accelerator cuda"), std::string::npos);
  EXPECT_NE(error_of([] { parse_cpu_devices("two"); }).find("--devices 2"), std::string::npos);
}

TEST(ParseGpuIds, AcceptsEveryForm) {
  using V = std::vector<int>;
  EXPECT_EQ(parse_gpu_ids("auto", 3), (V{0, 1, 2}));
  EXPECT_EQ(parse_gpu_ids("-1", 2), (V{0, 1}));
  EXPECT_EQ(parse_gpu_ids("2", 4), (V{0, 1}));
  EXPECT_EQ(parse_gpu_ids("0,2", 4), (V{0, 2}));
  EXPECT_EQ(parse_gpu_ids("[0, 1]", 2), (V{0, 1}));
  EXPECT_EQ(parse_gpu_ids("3,", 4), (V{3}));  // Lightning: "3," means the device with id 3
  EXPECT_EQ(parse_gpu_ids("[2]", 4), (V{2}));
}

TEST(ParseGpuIds, RejectsWhatIsNotThere) {
  EXPECT_NE(error_of([] { parse_gpu_ids("0", 2); }).find("--devices 1"), std::string::npos);
  EXPECT_NE(error_of([] { parse_gpu_ids("[]", 2); }).find("selects no device"), std::string::npos);
  EXPECT_NE(error_of([] { parse_gpu_ids("4", 2); }).find("Use --devices 2 or -1"), std::string::npos);
  EXPECT_NE(error_of([] { parse_gpu_ids("0,5", 2); }).find("CUDA_VISIBLE_DEVICES"), std::string::npos);
  EXPECT_NE(error_of([] { parse_gpu_ids("1,1", 2); }).find("twice"), std::string::npos);
  EXPECT_NE(error_of([] { parse_gpu_ids("0,,1", 2); }).find("not a device list"), std::string::npos);
  EXPECT_NE(error_of([] { parse_gpu_ids("[0, 1", 2); }).find("not a device list"), std::string::npos);
  EXPECT_NE(error_of([] { parse_gpu_ids("-2", 2); }).find("-1 (all)"), std::string::npos);
  EXPECT_NE(error_of([] { parse_gpu_ids("auto", 0); }).find("--accelerator cpu"), std::string::npos);
}

TEST(DevicesPerNode, FollowsTheAccelerator) {
  EXPECT_EQ(devices_per_node(Accelerator::cpu, "3", 0), 3);
  EXPECT_EQ(devices_per_node(Accelerator::cuda, "0,2", 4), 2);
  EXPECT_EQ(devices_per_node(Accelerator::cuda, "-1", 4), 4);
}

using testing::FakeGpus;

// Waits recorded, never slept; the jitter draw is 1.0 (each wait at its largest).
BackoffOptions no_sleep(std::vector<double>& waits) {
  return BackoffOptions().sleep([&waits](double s) { waits.push_back(s); }).uniform([] { return 1.0; });
}

TEST(PickFreeGpus, TakesTheLowestFreeIdsAndSkipsBusyOnes) {
  using V = std::vector<int>;
  FakeGpus gpus;
  EXPECT_EQ(pick_free_gpus(2, 4, gpus.probe()), (V{0, 1}));
  EXPECT_EQ(gpus.calls(), 2) << "stops probing once it has enough";
  gpus = FakeGpus{{0, 2}, {}};
  EXPECT_EQ(pick_free_gpus(2, 4, gpus.probe()), (V{1, 3}));
  EXPECT_EQ(gpus.calls(), 4);
  for (const auto& [id, count] : gpus.probed) EXPECT_EQ(count, 1) << "device " << id;
  gpus = FakeGpus{{1}, {}};
  EXPECT_EQ(pick_free_gpus(3, 4, gpus.probe()), (V{0, 2, 3}));
}

TEST(PickFreeGpus, TooFewFreeIsADeviceBusyErrorNamingThem) {
  FakeGpus gpus{{0, 2, 3}, {}};
  try {
    pick_free_gpus(2, 4, gpus.probe());
    ADD_FAILURE() << "picked 2 of 1 free";
  } catch (const DeviceBusyError& e) {
    EXPECT_NE(std::string(e.what()).find("1 of the 4 visible CUDA device(s) is free (busy or unusable: 0, 2, 3), 2 needed"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(pick_free_gpus(5, 4, gpus.probe()), UsageError);
  EXPECT_THROW(pick_free_gpus(0, 4, gpus.probe()), UsageError);
}

TEST(SelectGpuIds, ACountIsFilledWithFreeDevices) {
  using V = std::vector<int>;
  std::vector<double> waits;
  FakeGpus gpus{{0}, {}};
  EXPECT_EQ(select_gpu_ids("2", 4, gpus.probe(), no_sleep(waits)), (V{1, 2}));
  EXPECT_EQ(select_gpu_ids("-1", 3, FakeGpus().probe(), no_sleep(waits)), (V{0, 1, 2}));
  EXPECT_EQ(select_gpu_ids("auto", 2, FakeGpus().probe(), no_sleep(waits)), (V{0, 1}));
  EXPECT_TRUE(waits.empty());
}

TEST(SelectGpuIds, NamedIdsAreUsedAsGivenWithoutProbing) {
  FakeGpus gpus{{0, 1, 2, 3}, {}};
  std::vector<double> waits;
  EXPECT_EQ(select_gpu_ids("0,2", 4, gpus.probe(), no_sleep(waits)), (std::vector<int>{0, 2}));
  EXPECT_EQ(select_gpu_ids("[3]", 4, gpus.probe(), no_sleep(waits)), (std::vector<int>{3}));
  EXPECT_EQ(gpus.calls(), 0);
  // Bad specs fail as without auto selection, before any probe.
  EXPECT_NE(error_of([&] { select_gpu_ids("5", 4, gpus.probe(), no_sleep(waits)); }).find("Use --devices 4 or -1"),
            std::string::npos);
  EXPECT_NE(error_of([&] { select_gpu_ids("0", 4, gpus.probe(), no_sleep(waits)); }).find("selects no device"),
            std::string::npos);
  EXPECT_EQ(gpus.calls(), 0);
}

TEST(SelectGpuIds, RetriesWhileDevicesAreBusyAndTakesThemWhenFreed) {
  // Device 1 is busy for the first two tries (another job finishing), then free.
  int tries = 0;
  std::vector<double> waits;
  auto probe = [&](int id) {
    if (id == 0) ++tries;
    return id != 1 || tries > 2;
  };
  EXPECT_EQ(select_gpu_ids("2", 2, probe, no_sleep(waits)), (std::vector<int>{0, 1}));
  EXPECT_EQ(tries, 3);
  EXPECT_EQ(waits, (std::vector<double>{0.01, 0.02})) << "the seed's base_delay 0.01, doubled";
}

TEST(SelectGpuIds, TooFewFreeAfterTheLastTryIsAUsageError) {
  FakeGpus gpus{{1, 3}, {}};
  std::vector<double> waits;
  const std::string message = error_of([&] { select_gpu_ids("3", 4, gpus.probe(), no_sleep(waits)); });
  EXPECT_NE(message.find("--devices 3 --auto-select-gpus: 2 of the 4 visible CUDA device(s) are free (busy or "
                         "unusable: 1, 3), 3 needed after 5 tries"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("--devices 0,1"), std::string::npos) << message;
  EXPECT_EQ(gpus.probed[0], 5) << "one probe of each device per try, 5 tries (the seed's default)";
  EXPECT_EQ(gpus.calls(), 5 * 4);
  ASSERT_EQ(waits.size(), 4u) << "no wait after the last try";
  for (double w : waits) EXPECT_LE(w, 1.0) << "cap_delay";
}

TEST(SelectGpuIds, WaitsAreBoundedByCapDelay) {
  FakeGpus gpus{{0}, {}};
  std::vector<double> waits;
  auto options = no_sleep(waits).retries(10).base_delay(0.3).cap_delay(0.5);
  EXPECT_THROW(select_gpu_ids("1", 1, gpus.probe(), options), UsageError);
  EXPECT_EQ(gpus.calls(), 10);
  const std::vector<double> expected{0.3, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5};
  EXPECT_EQ(waits, expected);
}

TEST(ProbeCudaDevice, FalseOnThisCpuBuild) {
  if (torch::cuda::is_available()) GTEST_SKIP() << "CUDA build";
  EXPECT_FALSE(probe_cuda_device(0));
}

TEST(CudaDeviceCount, ZeroOnThisCpuBuild) {
  // Debian's libtorch is a CPU build; on a CUDA build this is the real count.
  if (torch::cuda::is_available()) GTEST_SKIP() << "CUDA build";
  EXPECT_EQ(cuda_device_count(), 0);
}

// Lightning's set_nvidia_flags: ids follow the PCI bus (nvidia-smi's order) unless the user chose
// an order; counting the devices sets it, and the processes launched later inherit it.
TEST(CudaDeviceCount, SetsPciBusOrderFirstUnlessTheUserChoseOne) {
  const char* before = std::getenv("CUDA_DEVICE_ORDER");
  const std::string saved = before ? before : "";
  ::unsetenv("CUDA_DEVICE_ORDER");
  cuda_device_count();
  ASSERT_NE(std::getenv("CUDA_DEVICE_ORDER"), nullptr);
  EXPECT_STREQ(std::getenv("CUDA_DEVICE_ORDER"), "PCI_BUS_ID");
  ::setenv("CUDA_DEVICE_ORDER", "FASTEST_FIRST", 1);
  cuda_device_count();
  EXPECT_STREQ(std::getenv("CUDA_DEVICE_ORDER"), "FASTEST_FIRST") << "the user's value is kept";
  if (before) {
    ::setenv("CUDA_DEVICE_ORDER", saved.c_str(), 1);
  } else {
    ::unsetenv("CUDA_DEVICE_ORDER");
  }
}

}  // namespace
}  // namespace accelerators
}  // namespace lockstep
