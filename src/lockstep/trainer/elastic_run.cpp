#include "elastic_run.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

namespace lockstep {
namespace detail {
namespace {

namespace fs = std::filesystem;

constexpr size_t kRecordBytes = 64;  // rewritten in place: one width, whatever the numbers

fs::path progress_file(const std::string& log_dir) { return fs::path(log_dir) / "progress.txt"; }

}  // namespace

bool under_restarting_launcher() { return std::getenv("TORCHELASTIC_RUN_ID") != nullptr; }

std::optional<int64_t> version_with_last_checkpoint(const std::string& experiment_dir) {
  std::optional<int64_t> best;
  std::error_code ignored;
  for (const auto& entry : fs::directory_iterator(experiment_dir, ignored)) {
    const std::string name = entry.path().filename().string();
    if (name.rfind("version_", 0) != 0 || name.size() == 8 || name.size() > 26) continue;
    if (name.find_first_not_of("0123456789", 8) != std::string::npos) continue;
    const int64_t version = std::stoll(name.substr(8));
    if ((!best || version > *best) && fs::exists(entry.path() / "checkpoints" / "last.ckpt", ignored)) best = version;
  }
  return best;
}

std::string run_id() {
  const char* id = std::getenv("TORCHELASTIC_RUN_ID");
  return id == nullptr ? "" : id;
}

bool made_by_this_job(const std::string& log_dir) {
  std::ifstream in(progress_file(log_dir));
  std::string record, line;
  return std::getline(in, record) && std::getline(in, line) && line == "run_id " + run_id();
}

std::optional<AttemptProgress> read_attempt_progress(const std::string& log_dir) {
  std::ifstream in(progress_file(log_dir));
  std::string world_key, step_key;
  AttemptProgress progress;
  if (!(in >> world_key >> progress.world_size >> step_key >> progress.global_step)) return std::nullopt;
  if (world_key != "world_size" || step_key != "global_step" || progress.world_size < 1) return std::nullopt;
  return progress;
}

AttemptRecord::AttemptRecord(const std::string& log_dir, int world_size, int64_t global_step)
    : world_size_(world_size) {
  std::error_code ignored;
  fs::create_directories(log_dir, ignored);
  fd_ = ::open(progress_file(log_dir).c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  at_step(global_step);
  // The second line names the job, which alone continues this folder (another job, even one
  // resuming from its checkpoint, makes a folder of its own).
  const std::string id = "run_id " + run_id() + "\n";
  if (fd_ >= 0 && ::pwrite(fd_, id.data(), id.size(), kRecordBytes) == static_cast<ssize_t>(id.size())) {
    (void)::ftruncate(fd_, static_cast<off_t>(kRecordBytes + id.size()));
  }
}

AttemptRecord::~AttemptRecord() {
  if (fd_ >= 0) ::close(fd_);
}

void AttemptRecord::at_step(int64_t global_step) {
  if (fd_ < 0 || global_step == written_) return;
  char record[kRecordBytes];
  const int n = std::snprintf(record, sizeof(record), "world_size %d global_step %lld", world_size_,
                              static_cast<long long>(global_step));
  for (size_t i = static_cast<size_t>(n); i < kRecordBytes - 1; ++i) record[i] = ' ';
  record[kRecordBytes - 1] = '\n';
  // A record that cannot be written costs the restart line its figures, never the run.
  if (::pwrite(fd_, record, kRecordBytes, 0) == static_cast<ssize_t>(kRecordBytes)) written_ = global_step;
}

std::string membership_line(const AttemptProgress& before, int world_size, const std::string& checkpoint,
                            int64_t checkpoint_step) {
  std::ostringstream line;
  line << "lockstep: ";
  if (before.world_size == world_size) {
    line << "the job restarted at the same world size " << world_size;
  } else {
    line << "membership changed: world size " << before.world_size << " -> " << world_size;
  }
  const int64_t lost = std::max<int64_t>(0, before.global_step - checkpoint_step);
  if (checkpoint.empty()) {
    line << "; no checkpoint yet, training from the start";
  } else {
    line << "; resumed " << checkpoint << " (step " << checkpoint_step << ")";
  }
  line << "; " << lost << " step(s) lost since it";
  if (lost > 0) line << " (steps " << checkpoint_step + 1 << "-" << before.global_step << " of the last attempt)";
  line << ".\n";
  return line.str();
}

int64_t next_batch_at(int64_t next_batch, int saved_world, int64_t saved_batches, int world_size, int64_t batches) {
  if (saved_world <= 0 || world_size <= 0 || saved_world == world_size) return next_batch;
  if (saved_batches > 0 && next_batch >= saved_batches) return batches;
  return next_batch * saved_world / world_size;
}

}  // namespace detail
}  // namespace lockstep
