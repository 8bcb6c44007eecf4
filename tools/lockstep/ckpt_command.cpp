// `lockstep ckpt inspect PATH` and `lockstep ckpt convert IN OUT --to FORMAT`: what a checkpoint
// holds, and the same checkpoint in another format (the formats are in ckpt_formats.h).
#include <chrono>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>

#include <torch/torch.h>

#include <lockstep/checkpoint/dcp_checkpoint.h>
#include <lockstep/checkpoint/safetensors.h>
#include <lockstep/core/error.h>

#include "ckpt_formats.h"
#include "commands.h"

namespace lockstep {
namespace tool {
namespace ckpt {
namespace command_detail {

namespace fs = std::filesystem;
using checkpoint::Checkpoint;

// Inputs of this size or more print progress lines without --progress.
constexpr uintmax_t kProgressBytes = uintmax_t{1} << 30;

struct CkptArgs {
  std::string in;
  std::string out;
  std::string to;
  int world_size = 0;
  bool overwrite = false;
  bool progress = false;
};

// "1.23 GB": a size for people.
std::string size_text(double bytes) {
  const char* units[] = {"bytes", "KB", "MB", "GB", "TB"};
  int unit = 0;
  while (bytes >= 1000 && unit < 4) bytes /= 1000, ++unit;
  std::ostringstream s;
  s << std::setprecision(unit == 0 ? 12 : 3) << bytes << " " << units[unit];
  return s.str();
}

// The bytes of a file, or of every file in a folder.
uintmax_t bytes_on_disk(const std::string& path) {
  std::error_code error;
  if (!fs::is_directory(path, error)) return fs::file_size(path, error);
  uintmax_t total = 0;
  for (const auto& entry : fs::recursive_directory_iterator(path, error)) {
    if (entry.is_regular_file(error)) total += entry.file_size(error);
  }
  return total;
}

// Runs `body` on the checkpoint at `path`: LibTorch's errors about contents of an unexpected
// layout become one UsageError naming the file.
template <typename Body>
auto on_contents(const std::string& path, const Body& body) -> decltype(body()) {
  try {
    return body();
  } catch (const c10::Error& e) {
    throw UsageError("'" + path + "' holds what its format does not lay out so (" + e.what_without_backtrace() +
                     "). Pass a checkpoint that Lockstep, torch.save or safetensors wrote.");
  }
}

// A format this build knows by name but cannot read or write (`action`: "reading", "writing").
[[noreturn]] void not_in_this_build(const Format& format, const std::string& subject, const std::string& action) {
  if (action == "writing" && !format.no_writer.empty()) {
    throw UsageError(subject + ": lockstep ckpt does not write the " + format.description + " format: " +
                     format.no_writer);
  }
  throw UsageError(subject + ": " + action + " the " + format.description + " format (" + format.name +
                   ") is not available in this build yet. Use lockstep, lockstep-sharded, torch or safetensors "
                   "checkpoints for now.");
}

// ---- inspect -----------------------------------------------------------------------------------

struct TensorEntry {
  std::string key;
  std::vector<int64_t> shape;
  at::ScalarType dtype = at::kFloat;
};

struct Listing {
  std::string format;                 // in words
  std::vector<std::string> facts;     // "world_size: 4", "epoch: 3"
  std::vector<std::string> others;    // top-level entries neither tensors nor single values
  std::vector<TensorEntry> tensors;   // in the file's order
  std::string weights;                // the key prefix of the model's weights ("" for all)
  bool has_weights = true;            // false: no entry holds them (a dict without a state_dict)
};

// Every tensor below `value`, keyed by its path of '/'-separated names.
void collect_tensors(const c10::IValue& value, const std::string& path, std::vector<TensorEntry>& out) {
  const auto join = [&](const std::string& name) { return path.empty() ? name : path + "/" + name; };
  if (value.isTensor()) {
    out.push_back({path, value.toTensor().sizes().vec(), value.toTensor().scalar_type()});
  } else if (value.isGenericDict()) {
    for (const auto& entry : value.toGenericDict()) {
      const auto& key = entry.key();
      collect_tensors(entry.value(), join(key.isString() ? key.toStringRef() : c10::str(key)), out);
    }
  } else if (value.isList() || value.isTuple()) {
    const auto items = value.isList() ? value.toListRef().vec() : value.toTupleRef().elements().vec();
    for (size_t i = 0; i < items.size(); ++i) collect_tensors(items[i], join(std::to_string(i)), out);
  }
}

// The top-level entries of `dict`: single values as facts ("epoch: 3"), the rest by name.
void add_entries(const Checkpoint& dict, Listing& listing) {
  for (const auto& entry : dict) {
    const std::string& key = entry.key().toStringRef();
    const auto& value = entry.value();
    if (value.isInt() || value.isDouble() || value.isBool() || value.isString()) {
      listing.facts.push_back(key + ": " + (value.isString() ? value.toStringRef() : c10::str(value)));
    } else if (!value.isTensor() && !value.isNone()) {
      listing.others.push_back(key);
    }
  }
}

std::string torch_file_kind(const Checkpoint& file) {
  if (file.contains("lockstep_version")) return "Lockstep full checkpoint file (torch.save zip)";
  if (file.contains("pytorch-lightning_version")) return "Lightning checkpoint file (torch.save zip)";
  if (file.contains("state_dict")) return "full checkpoint file (torch.save zip of a dict with a state_dict)";
  return "torch.save file (a dict)";
}

Listing list_torch_file(const std::string& path) {
  Listing listing;
  const Checkpoint file = checkpoint::CheckpointIO().load(path);
  const bool plain = std::all_of(file.begin(), file.end(), [](const auto& e) { return e.value().isTensor(); });
  listing.format = plain ? "plain torch.save file (a state_dict: tensors by name)" : torch_file_kind(file);
  listing.weights = plain ? "" : weights_key(file) + "/";
  listing.has_weights = plain || !weights_key(file).empty();
  add_entries(file, listing);
  collect_tensors(file, "", listing.tensors);
  return listing;
}

Listing list_safetensors(const std::string& path) {
  Listing listing;
  const bool index = path.size() > 5 && path.compare(path.size() - 5, 5, ".json") == 0;
  listing.format = index ? "safetensors sharded index (with its shards)" : "safetensors file";
  const auto file = checkpoint::load_safetensors(path);
  for (const auto& [key, value] : file.metadata) listing.facts.push_back("metadata " + key + ": " + value);
  for (const auto& item : file.tensors) {
    listing.tensors.push_back({item.key(), item.value().sizes().vec(), item.value().scalar_type()});
  }
  return listing;
}

// metadata.json for the tensors, and rank 0's file for the common dict: the other rank files are not read.
Listing list_sharded(const std::string& path) {
  Listing listing;
  const auto metadata = checkpoint::read_sharded_metadata(path);
  listing.format = "Lockstep sharded checkpoint folder";
  listing.facts.push_back("world_size: " + std::to_string(metadata.world_size));
  const Checkpoint common = checkpoint::load_sharded_pieces(path, {}).common;
  add_entries(common, listing);
  for (const auto& [key, info] : metadata.tensors) listing.tensors.push_back({key, info.shape, info.dtype});
  collect_tensors(common, "", listing.tensors);  // scalar state kept whole, such as Adam's step
  listing.weights = "state_dict/";
  return listing;
}

// .metadata for the tensors (by Lockstep's keys), and the bytes items for the common dict: no
// tensor chunk is read.
Listing list_dcp(const std::string& path) {
  Listing listing;
  const auto tensors = checkpoint::read_dcp_tensors(path);
  listing.format = "torch.distributed.checkpoint folder";
  const Checkpoint common = checkpoint::load_dcp_pieces(path, {}).common;
  add_entries(common, listing);
  for (const auto& [key, info] : tensors) listing.tensors.push_back({key, info.shape, info.dtype});
  collect_tensors(common, "", listing.tensors);  // scalar state kept whole, such as Adam's step
  listing.weights = "state_dict/";
  return listing;
}

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

void print_listing(const std::string& path, const Listing& listing) {
  std::cout << path << ": " << listing.format << "\n";
  for (const auto& fact : listing.facts) std::cout << fact << "\n";
  if (!listing.others.empty()) {
    std::cout << "other entries:";
    for (const auto& name : listing.others) std::cout << " " << name;
    std::cout << "\n";
  }
  int64_t elements = 0, bytes = 0, parameters = 0;
  size_t width = 0;
  for (const auto& t : listing.tensors) {
    const int64_t numel = c10::multiply_integers(t.shape);
    elements += numel;
    bytes += numel * static_cast<int64_t>(c10::elementSize(t.dtype));
    if (t.key.rfind(listing.weights, 0) == 0) parameters += numel;
    width = std::max(width, t.key.size());
  }
  std::cout << "tensors: " << listing.tensors.size() << ", " << elements << " elements, " << bytes << " bytes"
            << (bytes >= 1000 ? " (" + size_text(static_cast<double>(bytes)) + ")" : "") << "; model weights";
  if (!listing.has_weights) {
    std::cout << ": none found (no state_dict)\n";
  } else {
    std::cout << (listing.weights.empty() ? "" : " (" + listing.weights.substr(0, listing.weights.size() - 1) + ")")
              << ": " << parameters << " parameters\n";
  }
  for (const auto& t : listing.tensors) {
    std::cout << "  " << std::left << std::setw(static_cast<int>(width)) << t.key << "  " << std::setw(9)
              << dtype_text(t.dtype) << " " << shape_text(t.shape) << "\n";
  }
}

int run_inspect(const std::string& path) {
  const Format& format = detect_format(path);
  if (!format.read) not_in_this_build(format, "'" + path + "' is a " + format.description, "reading");
  const Listing listing = on_contents(path, [&] {
    if (format.name == "lockstep-sharded") return list_sharded(path);
    if (format.name == "dcp") return list_dcp(path);
    if (format.name == "safetensors") return list_safetensors(path);
    return list_torch_file(path);
  });
  print_listing(path, listing);
  return 0;
}

// ---- convert -----------------------------------------------------------------------------------

// OUT, checked before anything is read: named as its format is found again, not IN, and not
// replacing anything but a checkpoint of the same kind, only with --overwrite.
void check_out(const CkptArgs& args, const Format& to) {
  std::error_code ignored;
  const auto refuse = [&](const std::string& why) { throw UsageError("OUT '" + args.out + "' " + why); };
  if (fs::exists(args.out, ignored) && fs::equivalent(args.in, args.out, ignored)) {
    refuse("is IN itself; write the converted checkpoint to another path.");
  }
  const bool safetensors_name = checkpoint::is_safetensors_path(args.out);
  if (to.name == "safetensors" && !safetensors_name) {
    refuse("does not end in .safetensors (or .safetensors.index.json, for shards beside an index), which is how "
           "Lockstep and Hugging Face's tools know the format; name it model.safetensors, say.");
  }
  if (to.name != "safetensors" && safetensors_name) {
    refuse("ends in .safetensors, so Lockstep would read it as safetensors; name a " + to.name +
           " checkpoint otherwise (last.ckpt, weights.pt, a folder), or pass --to safetensors.");
  }
  if (!fs::exists(fs::symlink_status(args.out, ignored))) return;
  if (!args.overwrite) {
    refuse("exists; pass --overwrite to replace it (it is replaced whole, only once the new one is complete), or "
           "name another OUT.");
  }
  if (to.writes_folder && !checkpoint::is_sharded_checkpoint(args.out)) {
    refuse("exists and is not a Lockstep sharded checkpoint, so --overwrite does not replace it; name another OUT.");
  }
  if (!to.writes_folder && !fs::is_regular_file(args.out, ignored)) {
    refuse("exists and is not a file, so --overwrite does not replace it; name another OUT.");
  }
}

std::string joined(const std::vector<std::string>& items) {
  std::string text;
  for (const auto& item : items) text += (text.empty() ? "" : ", ") + item;
  return text;
}

int run_convert(const CkptArgs& args) {
  const Format& to = format_named(args.to);
  if (!to.write) not_in_this_build(to, "--to " + to.name, "writing");
  if (to.name == "lockstep-sharded" && args.world_size < 1) {
    throw UsageError("--to lockstep-sharded needs --world-size N (N >= 1: one rank file each, as the run that resumes "
                     "from it); got " + (args.world_size == 0 ? std::string("none") : std::to_string(args.world_size)) +
                     ". Pass --world-size 4, say.");
  }
  if (to.name != "lockstep-sharded" && args.world_size != 0) {
    throw UsageError("--world-size applies to --to lockstep-sharded only; leave it out for --to " + to.name + ".");
  }
  const Format& from = detect_format(args.in);
  if (!from.read) not_in_this_build(from, "'" + args.in + "' is a " + from.description, "reading");
  check_out(args, to);
  const bool verbose = args.progress || bytes_on_disk(args.in) >= kProgressBytes;
  const auto started = std::chrono::steady_clock::now();
  ConvertOptions options;
  options.world_size = args.world_size;
  options.progress = [&](const std::string& line) {
    if (!verbose) return;
    const std::chrono::duration<double> seconds = std::chrono::steady_clock::now() - started;
    std::cerr << "lockstep ckpt: " << line << " (" << std::fixed << std::setprecision(1) << seconds.count() << " s)"
              << std::defaultfloat << std::endl;
  };
  options.progress("reading " + args.in + " (" + from.description + ", " +
                   size_text(static_cast<double>(bytes_on_disk(args.in))) + ")");
  const auto source = on_contents(args.in, [&] { return from.read(args.in); });
  options.progress("writing " + args.out + " (" + to.description + ")");
  const auto left_out = on_contents(args.in, [&] { return to.write(*source, args.out, options); });
  if (!left_out.empty()) {
    std::cerr << "lockstep ckpt: note: a " << to.description << " holds model weights only; left out: "
              << joined(left_out) << " (--to lockstep or lockstep-sharded keeps everything)\n";
  }
  std::cout << "lockstep ckpt: wrote " << args.out << " (" << to.description << ", "
            << size_text(static_cast<double>(bytes_on_disk(args.out))) << ")\n";
  return 0;
}

}  // namespace command_detail
}  // namespace ckpt

Command add_ckpt_command(CLI::App& app) {
  using ckpt::command_detail::CkptArgs;
  auto args = std::make_shared<CkptArgs>();
  auto* sub = app.add_subcommand("ckpt", "Inspect and convert checkpoints: Lockstep's full and sharded ones, "
                                         "torch.save files, safetensors");
  sub->require_subcommand(1);
  auto* inspect = sub->add_subcommand("inspect", "Print a checkpoint's format, its tensors (key, dtype, shape), "
                                                 "sizes, world size and counters");
  inspect->add_option("path", args->in, "a checkpoint file, a .safetensors(.index.json), or a sharded folder")
      ->required();
  auto* convert = sub->add_subcommand("convert", "Write IN in another format; what OUT's format cannot hold is "
                                                 "named in one note");
  convert->add_option("in", args->in, "the checkpoint to convert (any format inspect reads)")->required();
  convert->add_option("out", args->out, "where to write it (a file, or a folder for lockstep-sharded)")->required();
  convert->add_option("--to", args->to, "lockstep | lockstep-sharded | torch | safetensors | dcp")->required();
  convert->add_option("--world-size", args->world_size, "ranks of a lockstep-sharded OUT (required with it)");
  convert->add_flag("--overwrite", args->overwrite, "replace an existing OUT of the same kind (atomically)");
  convert->add_flag("--progress", args->progress, "print progress lines to stderr whatever IN's size "
                                                  "(by default only from 1 GiB)");
  return {sub, [args, inspect] {
            return inspect->parsed() ? ckpt::command_detail::run_inspect(args->in)
                                     : ckpt::command_detail::run_convert(*args);
          }};
}

}  // namespace tool
}  // namespace lockstep
