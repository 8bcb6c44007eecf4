// `lockstep plot RUN_DIR`: renders RUN_DIR/metrics.csv into PNG curves with gnuplot, together with
// the runs it resumed from (RUN_DIR/resumed_from, written by the Trainer on resume), and the LR
// finder's RUN_DIR/lr_find.csv (--lr-find) into lr_find.png; `lockstep plot FILE.csv` draws an LR
// finder's CSV alone.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>

#include <lockstep/core/error.h>

#include "commands.h"

namespace lockstep {
namespace tool {
namespace {

namespace fs = std::filesystem;

// One metric over steps.
using Series = std::vector<std::pair<double, double>>;

std::vector<std::string> split_csv(const std::string& line) {
  std::vector<std::string> cells;
  std::stringstream fields(line);
  for (std::string cell; std::getline(fields, cell, ',');) cells.push_back(cell);
  if (!line.empty() && line.back() == ',') cells.emplace_back();
  return cells;
}

// Every column of RUN_DIR/metrics.csv but step, as (step, value) where the cell is filled.
std::map<std::string, Series> read_metrics(const fs::path& dir) {
  const auto csv = dir / "metrics.csv";
  if (!fs::exists(csv)) {
    throw UsageError(csv.string() + " does not exist; give the run directory that holds metrics.csv (fit prints "
                     "it as log_dir).");
  }
  std::ifstream in(csv);
  std::string line;
  std::getline(in, line);
  const auto columns = split_csv(line);
  if (columns.empty() || columns[0] != "step") {
    throw UsageError(csv.string() + " is not a Lockstep metrics.csv (its first column is not 'step').");
  }
  std::map<std::string, Series> metrics;
  while (std::getline(in, line)) {
    const auto cells = split_csv(line);
    if (cells.empty() || cells[0].empty()) continue;
    const double step = std::stod(cells[0]);
    for (size_t i = 1; i < cells.size() && i < columns.size(); ++i) {
      if (!cells[i].empty()) metrics[columns[i]].emplace_back(step, std::stod(cells[i]));
    }
  }
  return metrics;
}

// The run and the runs it resumed from, oldest first.
std::vector<fs::path> run_chain(const fs::path& dir) {
  std::vector<fs::path> chain{dir};
  while (chain.size() < 100) {
    std::ifstream link(chain.back() / "resumed_from");
    std::string origin;
    if (!std::getline(link, origin) || origin.empty() || !fs::exists(fs::path(origin) / "metrics.csv")) break;
    chain.emplace_back(origin);
  }
  std::reverse(chain.begin(), chain.end());
  return chain;
}

// The runs' metrics as one: each earlier run up to the step where the next one took over.
std::map<std::string, Series> joined_metrics(const std::vector<fs::path>& chain) {
  std::map<std::string, Series> joined;
  for (const auto& dir : chain) {
    const auto later = read_metrics(dir);
    double first = 1e300;
    for (const auto& [name, series] : later) {
      if (!series.empty()) first = std::min(first, series.front().first);
    }
    for (auto& [name, series] : joined) {
      series.erase(std::remove_if(series.begin(), series.end(), [&](const auto& p) { return p.first >= first; }),
                   series.end());
    }
    for (const auto& [name, series] : later) joined[name].insert(joined[name].end(), series.begin(), series.end());
  }
  return joined;
}

// TensorBoard's debiased exponential moving average: a readable trend through noisy steps.
Series smoothed(const Series& series, double weight = 0.8) {
  Series out;
  double average = 0, correction = 0;
  for (const auto& [step, value] : series) {
    average = weight * average + (1 - weight) * value;
    correction = weight * correction + (1 - weight);
    out.emplace_back(step, average / correction);
  }
  return out;
}

void write_block(std::ostringstream& s, const std::string& name, const Series& series) {
  s << "$" << name << " << EOD\n";
  for (const auto& [step, value] : series) s << step << " " << value << "\n";
  s << "EOD\n";
}

// A range with room around it; a single value gets a window of its own, so gnuplot draws the
// point instead of warning about an empty range.
std::string range(double lo, double hi) {
  const double pad = hi > lo ? (hi - lo) * 0.05 : std::max(std::abs(lo) * 0.1, 1.0);
  std::ostringstream s;
  s << "[" << lo - pad << ":" << hi + pad << "]";
  return s.str();
}

// One PNG for the metrics whose names contain `word` (loss, acc), against step; "" if none.
std::string plot_script(const std::map<std::string, Series>& metrics, const std::string& word, const fs::path& png,
                        const std::string& title) {
  std::ostringstream blocks, plots;
  double x_lo = 1e300, x_hi = -1e300, y_lo = 1e300, y_hi = -1e300;
  int index = 0;
  for (const auto& [name, series] : metrics) {
    if (name.find(word) == std::string::npos || series.empty()) continue;
    const std::string block = "m" + std::to_string(index++);
    write_block(blocks, block, series);
    for (const auto& [x, y] : series) {
      x_lo = std::min(x_lo, x), x_hi = std::max(x_hi, x), y_lo = std::min(y_lo, y), y_hi = std::max(y_hi, y);
    }
    // Few points (per-epoch values, or one): markers big enough to see; many: small dots.
    plots << (plots.tellp() > 0 ? ", " : "") << "$" << block << " using 1:2 with linespoints pt 7 ps "
          << (series.size() < 20 ? "1.5" : "0.5") << " title '" << name << "'";
    if (series.size() >= 20) {  // per-step values: a trend line through the noise
      write_block(blocks, block + "s", smoothed(series));
      plots << ", $" << block << "s using 1:2 with lines lw 2 title '" << name << " (smoothed)'";
    }
  }
  if (index == 0) return "";
  std::ostringstream s;
  s << "set terminal pngcairo size 900,540 noenhanced\nset output '" << png.string() << "'\n"
    << "set key outside right\nset grid\nset xlabel 'step'\nset ylabel '" << word << "'\n"
    << "set title '" << title << ": " << word << "'\n"
    << "set xrange " << range(x_lo, x_hi) << "\nset yrange " << range(y_lo, y_hi) << "\n"
    << blocks.str() << "plot " << plots.str() << "\n";
  return s.str();
}


// Runs gnuplot on `script`, which writes `png`; gnuplot's own messages (warnings included) would
// be ours to explain: kept, and shown only when it fails.
void run_gnuplot(const std::string& script, const fs::path& png) {
  const fs::path log = png.string() + ".gnuplot.log";
  FILE* gnuplot = ::popen(("gnuplot > '" + log.string() + "' 2>&1").c_str(), "w");
  if (gnuplot == nullptr) throw UsageError("plot needs gnuplot: apt-get install gnuplot-nox");
  std::fputs(script.c_str(), gnuplot);
  const int status = ::pclose(gnuplot);
  std::ifstream said(log);
  const std::string messages((std::istreambuf_iterator<char>(said)), std::istreambuf_iterator<char>());
  fs::remove(log);
  if (status != 0 || !fs::exists(png)) {
    throw UsageError("gnuplot failed to write " + png.string() + " (is gnuplot-nox installed? apt-get "
                     "install gnuplot-nox): " + messages);
  }
  if (!messages.empty()) std::cerr << "lockstep plot: gnuplot said: " << messages;
  std::cout << "lockstep plot: wrote " << png.string() << "\n";
}

// The LR finder's CSV (step,lr,loss,suggested) as loss against a logarithmic lr, the suggestion
// marked, as Lightning's lr_finder.plot(suggest=True).
std::string lr_find_script(const fs::path& csv, const fs::path& png) {
  std::ifstream in(csv);
  std::string line;
  std::getline(in, line);
  if (line.rfind("step,lr,loss,suggested", 0) != 0) {
    throw UsageError(csv.string() + " is not an LR finder's CSV (its header is not step,lr,loss,suggested); give "
                     "the lr_find.csv that --lr-find or LRFinder::write_csv wrote, or a run directory.");
  }
  std::ostringstream curve, best;
  std::string suggested;
  while (std::getline(in, line)) {
    const auto cells = split_csv(line);
    if (cells.size() < 4 || cells[2] == "nan" || cells[2] == "inf") continue;
    curve << cells[1] << " " << cells[2] << "\n";
    if (cells[3] == "1") {
      best << cells[1] << " " << cells[2] << "\n";
      suggested = cells[1];
    }
  }
  std::ostringstream s;
  s << "set terminal pngcairo size 900,540 noenhanced\nset output '" << png.string() << "'\n"
    << "set logscale x\nset format x '%.0e'\nset grid\nset key outside right\nset xlabel 'learning rate'\n"
    << "set ylabel 'loss (smoothed)'\nset title 'LR finder: " << csv.filename().string() << "'\n"
    << "$curve << EOD\n" << curve.str() << "EOD\n";
  if (!suggested.empty()) s << "$best << EOD\n" << best.str() << "EOD\n";
  s << "plot $curve using 1:2 with lines lw 2 title 'loss'";
  if (!suggested.empty()) s << ", $best using 1:2 with points pt 7 ps 2 lc rgb 'red' title 'suggested " << suggested << "'";
  s << "\n";
  return s.str();
}

void plot_lr_find(const fs::path& csv) {
  const fs::path png = csv.parent_path() / (csv.stem().string() + ".png");
  run_gnuplot(lr_find_script(csv, png), png);
}

// RUN_DIR's curves (with the runs it resumed from); how many PNGs were written.
int plot_run(const fs::path& dir) {
  const auto chain = run_chain(dir);
  const auto metrics = joined_metrics(chain);
  std::string title = dir.filename().string();
  if (chain.size() > 1) {
    title += " (resumed from";
    for (size_t i = 0; i + 1 < chain.size(); ++i) title += " " + chain[i].filename().string();
    title += ")";
  }
  int written = 0;
  for (const std::string word : {"loss", "acc"}) {
    const auto png = dir / (word + ".png");
    const std::string script = plot_script(metrics, word, png, title);
    if (script.empty()) continue;
    run_gnuplot(script, png);
    ++written;
  }
  if (written == 0) throw UsageError((dir / "metrics.csv").string() + " has no loss or acc column.");
  if (chain.size() > 1) {
    std::cout << "lockstep plot: drew " << chain.size() << " runs as one:";
    for (const auto& run : chain) std::cout << " " << run.string();
    std::cout << "\n";
  }
  return written;
}

}  // namespace

Command add_plot_command(CLI::App& app) {
  auto run_dir = std::make_shared<std::string>();
  auto* sub = app.add_subcommand("plot", "Render RUN_DIR/metrics.csv (a CSVLogger run, with the runs it resumed "
                                         "from) into loss and accuracy PNGs, and an LR finder's lr_find.csv into "
                                         "lr_find.png (log-x)");
  sub->add_option("run_dir", *run_dir, "e.g. lockstep_logs/version_0, or an lr_find.csv")->required();
  return {sub, [run_dir] {
            const fs::path path(*run_dir);
            // An LR finder's CSV alone, or a run directory with metrics.csv, lr_find.csv or both.
            if (fs::is_regular_file(path)) {
              plot_lr_find(path);
              return 0;
            }
            const bool lr_find = fs::exists(path / "lr_find.csv");
            if (!lr_find || fs::exists(path / "metrics.csv")) {
              read_metrics(path);  // the run itself must be readable
              plot_run(path);
            }
            if (lr_find) plot_lr_find(path / "lr_find.csv");
            return 0;
          }};
}

}  // namespace tool
}  // namespace lockstep
