#include <lockstep/core/model_summary.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>
#include <unordered_set>
#include <vector>

namespace lockstep {
namespace {

// "torch::nn::LinearImpl" -> "Linear", "my::NetImpl" -> "Net".
std::string type_name(const torch::nn::Module& module) {
  std::string name = module.name();
  const auto colon = name.rfind("::");
  if (colon != std::string::npos) name = name.substr(colon + 2);
  if (name.size() > 4 && name.compare(name.size() - 4, 4, "Impl") == 0) name.resize(name.size() - 4);
  return name;
}

struct Counts {
  int64_t trainable = 0, frozen = 0, bytes = 0;
  int64_t total() const { return trainable + frozen; }
};

// Each parameter once, however often it is registered.
Counts count(const torch::nn::Module& module) {
  Counts counts;
  std::unordered_set<const void*> seen;
  for (const auto& p : module.parameters()) {
    if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
    (p.requires_grad() ? counts.trainable : counts.frozen) += p.numel();
    counts.bytes += p.numel() * static_cast<int64_t>(p.element_size());
  }
  return counts;
}

std::string padded(const std::string& text, size_t width) {
  return text + std::string(width > text.size() ? width - text.size() : 0, ' ');
}

}  // namespace

std::string human_readable_count(int64_t count) {
  static const char* const labels[] = {" ", "K", "M", "B", "T"};
  const int digits = count > 0 ? static_cast<int>(std::floor(std::log10(static_cast<double>(count)))) + 1 : 1;
  const int groups = std::clamp((digits + 2) / 3, 1, 5);
  const double shifted = static_cast<double>(count) * std::pow(10.0, -3.0 * (groups - 1));
  char text[64];
  if (groups == 1 || shifted >= 100) {
    std::snprintf(text, sizeof(text), "%lld %s", static_cast<long long>(shifted), labels[groups - 1]);
  } else {
    std::snprintf(text, sizeof(text), "%.1f %s", shifted, labels[groups - 1]);
  }
  return text;
}

std::string model_summary(const torch::nn::Module& module) {
  std::vector<std::vector<std::string>> rows{{"", "Name", "Type", "Params", "Mode"}};
  int64_t training = module.is_training() ? 1 : 0, evaluating = 1 - training;
  for (const auto& child : module.named_children()) {
    rows.push_back({std::to_string(rows.size() - 1), child.key(), type_name(*child.value()),
                    human_readable_count(count(*child.value()).total()), child.value()->is_training() ? "train" : "eval"});
  }
  for (const auto& m : module.modules(/*include_self=*/false)) (m->is_training() ? training : evaluating) += 1;
  std::vector<size_t> width(5, 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::ostringstream out;
  std::string rule;
  for (size_t r = 0; r < rows.size(); ++r) {
    std::string line;
    for (size_t c = 0; c < rows[r].size(); ++c) line += (c ? " | " : "") + padded(rows[r][c], width[c]);
    if (r == 0) rule = std::string(line.size(), '-');
    out << line << "\n" << (r == 0 ? rule + "\n" : "");
  }
  const Counts all = count(module);
  char size[32];
  std::snprintf(size, sizeof(size), "%.3f", static_cast<double>(all.bytes) / 1e6);
  out << rule << "\n"
      << padded(human_readable_count(all.trainable), 10) << "Trainable params\n"
      << padded(human_readable_count(all.frozen), 10) << "Non-trainable params\n"
      << padded(human_readable_count(all.total()), 10) << "Total params\n"
      << padded(size, 10) << "Total estimated model params size (MB)\n"
      << padded(std::to_string(training), 10) << "Modules in train mode\n"
      << padded(std::to_string(evaluating), 10) << "Modules in eval mode\n";
  return out.str();
}

}  // namespace lockstep
