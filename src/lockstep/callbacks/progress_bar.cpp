#include <lockstep/callbacks/progress_bar.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <lockstep/callbacks/metric_format.h>

namespace lockstep {
namespace {

// tqdm's format_interval: "01:05", "1:02:03".
std::string interval(double seconds) {
  const auto total = static_cast<long long>(std::max(0.0, seconds));
  const long long h = total / 3600, m = total / 60 % 60, s = total % 60;
  char buffer[32];
  if (h > 0) {
    std::snprintf(buffer, sizeof buffer, "%lld:%02lld:%02lld", h, m, s);
  } else {
    std::snprintf(buffer, sizeof buffer, "%02lld:%02lld", m, s);
  }
  return buffer;
}

// "8.53it/s", or "2.10s/it" below one batch a second, as tqdm.
std::string rate_text(double rate) {
  if (rate <= 0) return "?it/s";
  return rate >= 1 ? detail::format_number("%.2fit/s", rate) : detail::format_number("%.2fs/it", 1.0 / rate);
}

std::string metrics_text(const std::map<std::string, double>& metrics) {
  std::string text;
  for (const auto& [name, value] : metrics) {
    text += (text.empty() ? "" : ", ") + name + "=" + detail::short_number(value);
  }
  return text;
}

// "; a=1, b=2" after a summary, or nothing when there are no metrics.
std::string with_metrics(const std::map<std::string, double>& metrics) {
  return metrics.empty() ? std::string() : "; " + metrics_text(metrics);
}

// What an epoch's line shows: every metric, with a value logged on_step only as its mean over
// the epoch rather than its last step's.
std::map<std::string, double> epoch_metrics(const TrainerView& trainer) {
  auto metrics = trainer.callback_metrics();
  for (const auto& [name, mean] : trainer.train_epoch_means()) metrics[name] = mean;
  return metrics;
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

ProgressBar::ProgressBar(ProgressBarOptions options)
    : options_(std::move(options)), live_(options_.live().value_or(::isatty(STDERR_FILENO) == 1)) {}

void ProgressBar::write(const std::string& text) {
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(STDERR_FILENO, text.data() + written, text.size() - written);
    if (n <= 0) return;  // a closed stderr must not stop training
    written += static_cast<size_t>(n);
  }
}

std::string ProgressBar::progress(const std::string& label, int64_t done, int64_t total,
                                  Clock::time_point start, const std::map<std::string, double>& metrics) const {
  const double elapsed = seconds_since(start);
  const double rate = elapsed > 0 ? static_cast<double>(done) / elapsed : 0.0;
  const double fraction = total > 0 ? std::min(1.0, static_cast<double>(done) / static_cast<double>(total)) : 1.0;
  std::string text = label + ": " + detail::format_number("%3.0f%%", 100.0 * fraction);
  if (live_) {
    const auto width = std::max<int64_t>(1, options_.bar_width());
    const auto filled = static_cast<int64_t>(fraction * static_cast<double>(width));
    text += "|" + std::string(filled, '#') + std::string(width - filled, ' ') + "|";
  }
  text += " " + std::to_string(done) + "/" + std::to_string(total) + " [" + interval(elapsed);
  if (rate > 0 && done < total) text += "<" + interval(static_cast<double>(total - done) / rate);
  text += ", " + rate_text(rate);
  const std::string shown = metrics_text(metrics);
  if (!shown.empty()) text += ", " + shown;
  return text + "]";
}

void ProgressBar::draw(const std::string& text, bool force, bool final) {
  if (!force && seconds_since(last_draw_) < options_.refresh_seconds()) return;
  last_draw_ = Clock::now();
  std::string line = "\r" + text;
  if (text.size() < drawn_width_) line += std::string(drawn_width_ - text.size(), ' ');
  drawn_width_ = text.size();
  if (final) {
    line += "\n";
    drawn_width_ = 0;
  }
  write(line);
}

bool ProgressBar::plain_line_due(int64_t done, int64_t total) const {
  if (options_.print_every_n_batches() > 0) return done % options_.print_every_n_batches() == 0 || done == total;
  if (total <= 0 || options_.print_every_percent() <= 0) return false;
  const double step = options_.print_every_percent();
  auto crossed = [&](int64_t d) {
    return static_cast<int64_t>(std::floor(100.0 * static_cast<double>(d) / static_cast<double>(total) / step + 1e-9));
  };
  return crossed(done) > crossed(done - 1);
}

void ProgressBar::on_fit_start(TrainerView& trainer, TrainingModule& module) { fitting_ = true; }

void ProgressBar::on_fit_end(TrainerView& trainer, TrainingModule& module) {
  fitting_ = false;
  if (live_ && drawn_width_ > 0 && trainer.is_global_zero()) write("\n");
  drawn_width_ = 0;
}

void ProgressBar::on_train_epoch_start(TrainerView& trainer, TrainingModule& module) {
  epoch_start_ = Clock::now();
  last_draw_ = Clock::time_point();
  batches_done_ = 0;
}

void ProgressBar::on_train_batch_end(TrainerView& trainer, TrainingModule& module, const torch::Tensor& loss,
                                     int64_t batch_idx) {
  batches_done_ = batch_idx + 1;
  if (!trainer.is_global_zero()) return;
  const int64_t total = trainer.num_training_batches();
  const std::string label = "Epoch " + std::to_string(trainer.current_epoch());
  if (live_) {
    draw(progress(label, batches_done_, total, epoch_start_, trainer.progress_bar_metrics()), batches_done_ == total,
         false);
    return;
  }
  if (plain_line_due(batches_done_, total)) {
    write(progress(label, batches_done_, total, epoch_start_, trainer.progress_bar_metrics()) + "\n");
  }
}

void ProgressBar::on_validation_start(TrainerView& trainer, TrainingModule& module) {
  validation_start_ = Clock::now();
}

void ProgressBar::on_validation_batch_end(TrainerView& trainer, TrainingModule& module, int64_t batch_idx) {
  if (!live_ || trainer.sanity_checking() || !trainer.is_global_zero()) return;
  const int64_t total = trainer.num_val_batches();
  draw(progress("Validation", batch_idx + 1, total, validation_start_, {}), batch_idx + 1 == total, false);
}

void ProgressBar::on_validation_end(TrainerView& trainer, TrainingModule& module) {
  if (fitting_ || !trainer.is_global_zero()) return;
  // trainer.validate(): one line with the results.
  const int64_t total = trainer.num_val_batches();
  const std::string text = "Validation done: " + std::to_string(total) + " batches in " +
                           interval(seconds_since(validation_start_)) + with_metrics(trainer.callback_metrics());
  if (live_) {
    draw(text, true, true);
  } else {
    write(text + "\n");
  }
}

void ProgressBar::on_train_epoch_end(TrainerView& trainer, TrainingModule& module) {
  if (!trainer.is_global_zero()) return;
  const std::string label = "Epoch " + std::to_string(trainer.current_epoch());
  if (live_) {
    draw(progress(label, batches_done_, trainer.num_training_batches(), epoch_start_, epoch_metrics(trainer)), true,
         true);
    return;
  }
  const double elapsed = seconds_since(epoch_start_);
  const double rate = elapsed > 0 ? static_cast<double>(batches_done_) / elapsed : 0.0;
  write(label + " done: " + std::to_string(batches_done_) + " batches in " + interval(elapsed) + " (" +
        rate_text(rate) + ")" + with_metrics(epoch_metrics(trainer)) + "\n");
}

}  // namespace lockstep
