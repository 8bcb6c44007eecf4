// `lockstep plot RUN_DIR`: renders RUN_DIR/metrics.csv into PNG curves with gnuplot.
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

#include <lockstep/core/usage_error.h>

#include "commands.h"

namespace lockstep {
namespace tool {
namespace {

std::vector<std::string> csv_header(const std::filesystem::path& csv) {
  std::ifstream in(csv);
  std::string line;
  std::getline(in, line);
  std::vector<std::string> columns;
  std::stringstream fields(line);
  for (std::string column; std::getline(fields, column, ',');) columns.push_back(column);
  return columns;
}

// One PNG per group of columns whose names contain `word` (loss, acc), against step.
std::string plot_script(const std::filesystem::path& csv, const std::vector<std::string>& columns,
                        const std::string& word, const std::filesystem::path& png) {
  std::ostringstream s;
  s << "set datafile separator ','\nset terminal pngcairo size 900,540 noenhanced\nset output '" << png.string() << "'\n"
    << "set key outside right\nset grid\nset xlabel 'step'\nset ylabel '" << word << "'\n"
    << "set title '" << csv.parent_path().filename().string() << ": " << word << "'\nplot ";
  bool first = true;
  for (size_t i = 0; i < columns.size(); ++i) {
    if (columns[i].find(word) == std::string::npos) continue;
    const size_t step_column = 1;  // CSVLogger writes step first
    s << (first ? "" : ", ") << "'" << csv.string() << "' every ::1 using " << step_column << ":($" << i + 1
      << ") with linespoints title '" << columns[i] << "'";
    first = false;
  }
  s << "\n";
  return first ? "" : s.str();
}

}  // namespace

Command add_plot_command(CLI::App& app) {
  auto run_dir = std::make_shared<std::string>();
  auto* sub = app.add_subcommand("plot", "Render RUN_DIR/metrics.csv (a CSVLogger run) into loss and accuracy PNGs");
  sub->add_option("run_dir", *run_dir, "e.g. lockstep_logs/version_0")->required();
  return {sub, [run_dir] {
            const std::filesystem::path dir(*run_dir);
            const auto csv = dir / "metrics.csv";
            if (!std::filesystem::exists(csv)) {
              throw UsageError(csv.string() + " does not exist; give the run directory that "
                               "holds metrics.csv (fit prints it as log_dir).");
            }
            const auto columns = csv_header(csv);
            if (columns.empty() || columns[0] != "step") {
              throw UsageError(csv.string() + " is not a Lockstep metrics.csv (its first column "
                               "is not 'step').");
            }
            int written = 0;
            for (const std::string word : {"loss", "acc"}) {
              const auto png = dir / (word + ".png");
              const std::string script = plot_script(csv, columns, word, png);
              if (script.empty()) continue;
              FILE* gnuplot = ::popen("gnuplot 2>&1", "w");
              if (gnuplot == nullptr) throw UsageError("plot needs gnuplot: apt-get install gnuplot-nox");
              std::fputs(script.c_str(), gnuplot);
              const int status = ::pclose(gnuplot);
              if (status != 0 || !std::filesystem::exists(png)) {
                throw UsageError("gnuplot failed to write " + png.string() +
                                 " (is gnuplot-nox installed? apt-get install gnuplot-nox)");
              }
              std::cout << "lockstep plot: wrote " << png.string() << "\n";
              ++written;
            }
            if (written == 0) throw UsageError(csv.string() + " has no loss or acc column.");
            return 0;
          }};
}

}  // namespace tool
}  // namespace lockstep
