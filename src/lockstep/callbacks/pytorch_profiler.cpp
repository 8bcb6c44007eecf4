#include <lockstep/callbacks/pytorch_profiler.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <ATen/record_function.h>
#include <torch/csrc/autograd/profiler_legacy.h>

#include <lockstep/core/error.h>

#include "chrome_trace.h"

namespace lockstep {
namespace {

namespace legacy = torch::autograd::profiler;

// A record_function range, as Python's torch.profiler.record_function(action) opens.
class UserRange : public Profiler::Range {
 public:
  explicit UserRange(const std::string& action) : guard_(at::RecordScope::USER_SCOPE) {
    // The profiler copies the name when the range opens.
    if (guard_.isActive()) guard_.before(action.c_str(), c10::ArrayRef<const c10::IValue>{});
  }

 private:
  at::RecordFunction guard_;
};

// The training batch that marks each step: its loading opens it.
constexpr const char* kBatchAction = "train_dataloader_next";

void write_trace(const std::string& path, const nlohmann::json& trace) {
  std::error_code error;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), error);
  if (error) throw IoError("creating the folder of the profiler trace", path, error);
  const std::string partial = path + ".partial";
  {
    std::ofstream out(partial);
    out << trace.dump() << "\n";
    out.flush();
    if (!out) throw IoError("writing the profiler trace", partial, errno);
  }
  if (std::rename(partial.c_str(), path.c_str()) != 0) throw IoError("renaming the profiler trace to", path, errno);
}

}  // namespace

PyTorchProfiler::PyTorchProfiler(PyTorchProfilerOptions options) : options_(std::move(options)) {
  LOCKSTEP_CHECK(options_.wait() >= 0, UsageError, "PyTorchProfilerOptions::wait is ", options_.wait(),
                 ": use 0 or more (the training batches before the trace).");
  LOCKSTEP_CHECK(options_.active() >= 1, UsageError, "PyTorchProfilerOptions::active is ", options_.active(),
                 ": use 1 or more (the training batches traced); to trace nothing, set no profiler.");
  LOCKSTEP_CHECK(options_.row_limit() >= 0, UsageError, "PyTorchProfilerOptions::row_limit is ",
                 options_.row_limit(), ": use 0 or more (0 prints no table).");
}

PyTorchProfiler::~PyTorchProfiler() {
  // The profiler is on for the thread that started it only; another thread cannot stop it.
  if (!tracing_ || std::this_thread::get_id() != tracing_thread_) return;
  try {
    legacy::disableProfilerLegacy();
  } catch (const std::exception&) {  // nothing to report to at destruction
  }
}

void PyTorchProfiler::record(const std::string&, double) {}

std::unique_ptr<Profiler::Range> PyTorchProfiler::start(const std::string& action) {
  if (action == kBatchAction) {
    if (batches_ == options_.wait()) begin_trace();
    if (batches_ == options_.wait() + options_.active()) end_trace();
    ++batches_;
  }
  if (!tracing_ || std::this_thread::get_id() != tracing_thread_) return nullptr;
  return std::make_unique<UserRange>(action);
}

void PyTorchProfiler::setup(const std::string& stage, int global_rank, const std::string& log_dir) {
  stage_ = stage;
  rank_ = global_rank;
  dir_ = options_.dirpath().empty() ? (std::filesystem::path(log_dir) / "profiler").string() : options_.dirpath();
  batches_ = 0;
  trace_path_.clear();
  table_.clear();
}

void PyTorchProfiler::teardown(const std::string&) {
  if (tracing_) end_trace();
}

void PyTorchProfiler::begin_trace() {
  if (tracing_) return;
  legacy::enableProfilerLegacy(torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::CPU));
  tracing_thread_ = std::this_thread::get_id();
  tracing_ = true;
}

void PyTorchProfiler::end_trace() {
  if (std::this_thread::get_id() != tracing_thread_) return;
  const auto trace = detail::trace_of(legacy::disableProfilerLegacy());
  tracing_ = false;
  traced_batches_ = batches_ - options_.wait();
  trace_path_ = (std::filesystem::path(dir_) / (stage_ + "-rank_" + std::to_string(rank_) + ".pt.trace.json")).string();
  table_ = options_.row_limit() > 0 ? detail::span_table(trace.spans, static_cast<size_t>(options_.row_limit())) : "";
  write_trace(trace_path_, detail::chrome_trace(trace, rank_));
}

std::string PyTorchProfiler::summary() const {
  const int64_t first = options_.wait() + 1;
  if (trace_path_.empty()) {
    return "PyTorchProfiler: no trace: fit ran " + std::to_string(batches_) + " training batches, and the trace " +
           "begins at batch " + std::to_string(first) + ". Lower PyTorchProfilerOptions::wait (" +
           std::to_string(options_.wait()) + ").\n";
  }
  const std::string file = stage_ + "-rank_<R>.pt.trace.json";
  return "PyTorchProfiler: traced training batches " + std::to_string(first) + " to " +
         std::to_string(first + traced_batches_ - 1) + " into " + (std::filesystem::path(dir_) / file).string() +
         " on each rank R; open one in https://ui.perfetto.dev or chrome://tracing. Rank " +
         std::to_string(rank_) + "'s time by action and operation:\n" + table_;
}

}  // namespace lockstep
