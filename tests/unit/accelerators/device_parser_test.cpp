#include <lockstep/accelerators/device_parser.h>

#include <gtest/gtest.h>

#include <lockstep/core/usage_error.h>

namespace lockstep {
namespace accelerators {
namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "<no error>";
}

TEST(ParseAccelerator, ResolvesNamesAgainstTheDeviceCount) {
  EXPECT_EQ(parse_accelerator("auto", 0), "cpu");
  EXPECT_EQ(parse_accelerator("auto", 2), "cuda");
  EXPECT_EQ(parse_accelerator("CPU", 2), "cpu");
  EXPECT_EQ(parse_accelerator("gpu", 1), "cuda");
  EXPECT_EQ(parse_accelerator("cuda", 1), "cuda");
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
  EXPECT_EQ(devices_per_node("cpu", "3", 0), 3);
  EXPECT_EQ(devices_per_node("cuda", "0,2", 4), 2);
  EXPECT_EQ(devices_per_node("cuda", "-1", 4), 4);
}

TEST(CudaDeviceCount, ZeroOnThisCpuBuild) {
  // Debian's libtorch is a CPU build; on a CUDA build this is the real count.
  if (torch::cuda::is_available()) GTEST_SKIP() << "CUDA build";
  EXPECT_EQ(cuda_device_count(), 0);
}

}  // namespace
}  // namespace accelerators
}  // namespace lockstep
