#include <lockstep/checkpoint/checkpoint_io.h>
#include <lockstep/checkpoint/safetensors.h>

#include <algorithm>
#include <cerrno>
#include <exception>
#include <filesystem>
#include <fstream>

#include <caffe2/serialize/inline_container.h>
#include <c10/util/Exception.h>
#include <torch/csrc/jit/serialization/export.h>
#include <torch/csrc/jit/serialization/pickler.h>

#include <lockstep/core/error.h>

#include "atomic_file.h"
#include "safetensors_index.h"
#include "torch_file.h"
#include "zip_check.h"

namespace lockstep {
namespace checkpoint {
namespace {

namespace fs = std::filesystem;

const char* const kResumeHint =
    "Pass a checkpoint written by Lockstep (--ckpt-path PATH, or --ckpt-path last for the newest one)";

[[noreturn]] void not_a_checkpoint(const std::string& path, const std::string& why) {
  throw UsageError("'" + path + "' is not a Lockstep checkpoint: " + why + ". " + kResumeHint + ".");
}

[[noreturn]] void damaged(const std::string& path, const std::string& why) {
  throw UsageError("checkpoint '" + path + "' is damaged: " + why +
                   ". It cannot be loaded: pass an earlier checkpoint (--ckpt-path PATH), or write the file again.");
}

std::vector<char> read_file(const std::string& path) {
  std::error_code error;
  const auto status = fs::status(path, error);
  if (!fs::exists(status)) {
    throw UsageError("checkpoint '" + path + "' does not exist. " + kResumeHint + ".");
  }
  if (fs::is_directory(status)) {
    throw UsageError("checkpoint '" + path + "' is a directory, not a file. " + kResumeHint +
                     "; checkpoints are the .ckpt files inside it.");
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    throw UsageError("checkpoint '" + path + "' cannot be opened (" + std::generic_category().message(errno) +
                     "). Check its permissions, or pass another checkpoint (--ckpt-path PATH).");
  }
  in.seekg(0, std::ios::end);
  std::vector<char> bytes(static_cast<size_t>(std::max<std::streamoff>(in.tellg(), 0)));
  in.seekg(0, std::ios::beg);
  if (!in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()))) {
    throw UsageError("checkpoint '" + path + "' could not be read to the end (" +
                     std::generic_category().message(errno) + "). Check the disk, or pass another checkpoint (--ckpt-path PATH).");
  }
  return bytes;
}

void check_format(const std::string& path, const std::vector<char>& bytes) {
  if (bytes.empty()) damaged(path, "the file is empty");
  if (bytes.size() >= 2 && static_cast<unsigned char>(bytes[0]) == 0x80 && bytes[1] == 0x02) {
    not_a_checkpoint(path, "it is in torch.save's legacy format (_use_new_zipfile_serialization=False), "
                           "which LibTorch does not read");
  }
  if (bytes.size() < 4 || std::string(bytes.data(), 4) != std::string("PK\x03\x04", 4)) {
    not_a_checkpoint(path, "it is not a zip archive as written by torch.save");
  }
  const std::string problem = detail::check_zip(bytes.data(), bytes.size());
  if (!problem.empty()) damaged(path, problem);
}

// The tensors of `checkpoint` by name, for a safetensors file: anything else is refused by name.
c10::Dict<std::string, torch::Tensor> tensors_only(const c10::IValue& checkpoint, const std::string& path) {
  c10::Dict<std::string, torch::Tensor> tensors;
  std::string others;
  if (checkpoint.isGenericDict()) {
    for (const auto& entry : checkpoint.toGenericDict()) {
      if (entry.key().isString() && entry.value().isTensor()) {
        tensors.insert(entry.key().toStringRef(), entry.value().toTensor());
      } else if (others.size() < 200) {
        others += (others.empty() ? "" : ", ") + (entry.key().isString() ? "'" + entry.key().toStringRef() + "'" : "a " +
                  entry.key().type()->str() + " key") + " (" + entry.value().type()->str() + ")";
      }
    }
  }
  if (!checkpoint.isGenericDict() || !others.empty()) {
    throw UsageError("CheckpointIO::save('" + path + "'): a .safetensors file holds tensors by name only (a "
                     "state_dict), and this checkpoint " + (checkpoint.isGenericDict() ? "also holds " + others
                     : "is a " + checkpoint.type()->str()) + ". Save the model's state_dict there, and the whole "
                     "checkpoint to a .ckpt file.");
  }
  return tensors;
}

}  // namespace

namespace detail {
namespace {

// The value with every list and dict made generic (element types Any), so the pickle holds plain
// lists and dicts instead of torch.jit._pickle.build_intlist(...) and restore_type_tag(...) calls.
c10::IValue untyped(const c10::IValue& value) {
  if (value.isList()) {
    c10::impl::GenericList out(c10::AnyType::get());
    for (const auto& item : value.toListRef()) out.push_back(untyped(item));
    return out;
  }
  if (value.isGenericDict()) {
    c10::impl::GenericDict out(c10::AnyType::get(), c10::AnyType::get());
    for (const auto& entry : value.toGenericDict()) out.insert(untyped(entry.key()), untyped(entry.value()));
    return out;
  }
  if (value.isTuple()) {
    std::vector<c10::IValue> items;
    for (const auto& item : value.toTupleRef().elements()) items.push_back(untyped(item));
    return c10::ivalue::Tuple::create(std::move(items));
  }
  return value;
}

}  // namespace

// torch::pickle_save's archive (archive/data.pkl, archive/data/<N> per storage, archive/version)
// built from the same parts, but with the pickler's type tags off: torch.load(weights_only=True)
// refuses the torch.jit._pickle globals that tags and typed lists add, and it is the default
// from PyTorch 2.6 on.
std::size_t torch_save(const c10::IValue& value, const WriteBytes& write) {
  std::vector<char> pickle;
  torch::jit::Pickler pickler([&](const char* bytes, size_t size) { pickle.insert(pickle.end(), bytes, bytes + size); },
                              /*tensor_table=*/nullptr, /*type_renamer=*/nullptr, /*memoized_class_types=*/nullptr,
                              /*get_tensor_id=*/nullptr, /*tag_aggregates=*/false);
  pickler.protocol();
  pickler.pushIValue(untyped(value));
  pickler.stop();
  std::size_t written = 0;
  std::exception_ptr failure;
  {
    // The writer must not see the failure: it would write its end again from its destructor and
    // throw there. It ends quietly, writing nothing more, and the failure is thrown after it.
    caffe2::serialize::PyTorchStreamWriter writer([&](const void* bytes, size_t size) {
      if (failure) return size;
      try {
        write(static_cast<const char*>(bytes), size);
        written += size;
      } catch (...) {
        failure = std::current_exception();
      }
      return size;
    });
    torch::jit::writeArchiveAndTensors("data", pickle.data(), pickle.size(), pickler.tensorData(), writer);
    writer.writeEndOfFile();
  }
  if (failure) std::rethrow_exception(failure);
  return written;
}

std::vector<char> torch_save_bytes(const c10::IValue& value) {
  std::vector<char> archive;
  torch_save(value, [&](const char* bytes, std::size_t size) { archive.insert(archive.end(), bytes, bytes + size); });
  return archive;
}

at::Tensor in_own_storage(const at::Tensor& tensor) {
  const at::Tensor values = tensor.contiguous();
  if (values.storage_offset() == 0 && values.storage().nbytes() == values.nbytes()) return values;
  return at::from_blob(values.data_ptr(), values.sizes(), [keep = values](void*) {}, values.options());
}

}  // namespace detail

Checkpoint make_checkpoint() { return Checkpoint(c10::StringType::get(), c10::AnyType::get()); }

void CheckpointIO::save(const c10::IValue& checkpoint, const std::string& path) const {
  if (is_safetensors_path(path)) {
    save_safetensors(tensors_only(checkpoint, path), path, {{"format", "pt"}});
    return;
  }
  if (!checkpoint.isGenericDict()) {
    throw UsageError("CheckpointIO::save('" + path + "'): a checkpoint must be a dict, got a " +
                     checkpoint.type()->str() + ". Build it with lockstep::checkpoint::make_checkpoint().");
  }
  for (const auto& entry : checkpoint.toGenericDict()) {
    if (!entry.key().isString()) {
      throw UsageError("CheckpointIO::save('" + path + "'): checkpoint keys must be strings, got a " +
                       entry.key().type()->str() + " key. Use string keys such as \"state_dict\".");
    }
  }
  detail::write_atomically(path, "saving checkpoint",
                           [&](const detail::WriteBytes& write) { detail::torch_save(checkpoint, write); });
}

Checkpoint CheckpointIO::load(const std::string& path) const {
  if (is_safetensors_path(path)) {
    Checkpoint tensors = make_checkpoint();
    for (const auto& item : load_safetensors(path).tensors) tensors.insert(item.key(), item.value());
    return tensors;
  }
  const std::vector<char> bytes = read_file(path);
  check_format(path, bytes);
  const detail::TorchFile file = detail::read_torch_file(bytes);
  if (file.damaged) damaged(path, file.problem);
  if (!file.problem.empty()) throw UsageError("'" + path + "' " + file.problem + ".");
  const c10::IValue& value = file.value;
  if (!value.isGenericDict()) not_a_checkpoint(path, "it holds a " + value.type()->str() + ", not a dict");
  for (const auto& entry : value.toGenericDict()) {
    if (!entry.key().isString()) not_a_checkpoint(path, "its dict has a non-string key (" + entry.key().type()->str() + ")");
  }
  return value.toGenericDict();
}

void CheckpointIO::remove(const std::string& path) const {
  std::error_code error;
  std::error_code ignored;
  if (is_safetensors_index_path(path) && fs::exists(path, ignored)) {
    for (const auto& shard : detail::shards_of_index(path)) fs::remove(shard, error);
    if (!error) fs::remove(path, error);
  } else if (fs::is_directory(path, ignored)) {
    fs::remove_all(path, error);
  } else {
    fs::remove(path, error);
  }
  if (error) {
    throw IoError("removing checkpoint", path, error,
                  "Check that its folder is writable: removing a file needs write permission on the folder.");
  }
}

void require_keys(const Checkpoint& checkpoint, const std::vector<std::string>& keys, const std::string& path) {
  std::string missing;
  for (const auto& key : keys) {
    if (!checkpoint.contains(key)) missing += (missing.empty() ? "\"" : ", \"") + key + "\"";
  }
  if (missing.empty()) return;
  std::string present;
  for (const auto& entry : checkpoint) {
    present += (present.empty() ? "\"" : ", \"") + entry.key().toStringRef() + "\"";
  }
  not_a_checkpoint(path, "it lacks the keys " + missing + " (it has " + (present.empty() ? "none" : present) + ")");
}

}  // namespace checkpoint
}  // namespace lockstep
