#include <lockstep/distributed/ddp/sync_batchnorm.h>

#include <sstream>
#include <stdexcept>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/torch.h>

#include <lockstep/core/error.h>
#include <lockstep/distributed/collectives.h>

namespace lockstep {
namespace distributed {
namespace {

// All dimensions but the channel dimension (1).
std::vector<int64_t> reduced_dims(const at::Tensor& input) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < input.dim(); ++d) dims.push_back(d);
  return dims;
}

// Shape that broadcasts a per-channel vector over (N, C, ...).
std::vector<int64_t> channel_shape(const at::Tensor& input) {
  std::vector<int64_t> shape(static_cast<size_t>(input.dim()), 1);
  shape[1] = input.size(1);
  return shape;
}

void all_reduce_sum(ProcessGroup& group, at::Tensor& tensor, const char* what) {
  all_reduce(group, tensor, ReduceOp::sum, CollectiveOptions().tag(what));
}

// Every rank's `local` (same shape everywhere), stacked: one collective per forward.
at::Tensor gather_statistics(ProcessGroup& group, const at::Tensor& local) {
  std::vector<std::vector<at::Tensor>> out(1);
  for (int r = 0; r < group.world_size(); ++r) out[0].push_back(torch::empty_like(local));
  std::vector<at::Tensor> in{local};
  c10d::AllgatherOptions options;
  options.timeout = group.timeout();
  try {
    group.backend()->allgather(out, in, options)->wait(group.timeout());
  } catch (const std::exception& e) {
    throw DistributedError(group.describe() + ": SyncBatchNorm's all_gather of batch statistics did not complete (timeout " +
                           std::to_string(group.timeout().count() / 1000.0) + " s): " + message_of(e) +
                           "\nEvery rank must run the same SyncBatchNorm forwards in training mode, in the same order.");
  }
  return torch::stack(out[0]);
}

// x_hat = (x - mean) * invstd with the statistics of the whole distributed batch. Its backward
// needs two per-channel sums over the whole batch, all-reduced across the ranks; mean and invstd
// depend on every rank's input, which the formula accounts for:
//   dx = invstd * (g - mean(g) - x_hat * mean(g * x_hat)),  means over all ranks' elements.
struct SyncNormalize : torch::autograd::Function<SyncNormalize> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& input, const at::Tensor& mean,
                            const at::Tensor& invstd, double total_count, ProcessGroup* group) {
    const auto shape = channel_shape(input);
    auto x_hat = (input - mean.view(shape)) * invstd.view(shape);
    ctx->save_for_backward({x_hat, invstd});
    ctx->saved_data["total_count"] = total_count;
    // The group outlives the module (SyncBatchNorm's contract), hence the graph.
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(group);
    return x_hat;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& x_hat = saved[0];
    const auto& invstd = saved[1];
    auto* group = reinterpret_cast<ProcessGroup*>(ctx->saved_data["group"].toInt());
    const double n = ctx->saved_data["total_count"].toDouble();
    const auto& g = grads[0];
    const auto dims = reduced_dims(x_hat);
    const int64_t channels = x_hat.size(1);
    // Sums in double so that the ranks' order of summation does not show at 1e-7.
    auto sums = torch::cat({g.sum(dims).to(torch::kDouble), (g * x_hat).sum(dims).to(torch::kDouble)});
    all_reduce_sum(*group, sums, "SyncBatchNorm backward");
    const auto shape = channel_shape(x_hat);
    auto mean_g = (sums.narrow(0, 0, channels) / n).to(g.scalar_type()).view(shape);
    auto mean_gx = (sums.narrow(0, channels, channels) / n).to(g.scalar_type()).view(shape);
    auto dx = (g - mean_g - x_hat * mean_gx) * invstd.view(shape);
    return {dx, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

SyncBatchNormImpl::SyncBatchNormImpl(const torch::nn::BatchNormOptions& options_, ProcessGroup* group)
    : options(options_), group_(group) {
  reset();
}

SyncBatchNormImpl::SyncBatchNormImpl(const torch::nn::BatchNormOptions& options_, ProcessGroup* group,
                                     const State& adopt)
    : options(options_), group_(group), adopt_(&adopt) {
  reset();
  adopt_ = nullptr;
}

void SyncBatchNormImpl::reset() {
  const int64_t c = options.num_features();
  if (options.affine()) {
    weight = register_parameter("weight", adopt_ ? adopt_->weight : torch::ones({c}));
    bias = register_parameter("bias", adopt_ ? adopt_->bias : torch::zeros({c}));
  } else {
    weight = register_parameter("weight", at::Tensor(), /*requires_grad=*/false);
    bias = register_parameter("bias", at::Tensor(), /*requires_grad=*/false);
  }
  if (options.track_running_stats()) {
    running_mean = register_buffer("running_mean", adopt_ ? adopt_->running_mean : torch::zeros({c}));
    running_var = register_buffer("running_var", adopt_ ? adopt_->running_var : torch::ones({c}));
    num_batches_tracked = register_buffer(
        "num_batches_tracked", adopt_ ? adopt_->num_batches_tracked : torch::tensor(0, torch::kLong));
  } else {
    running_mean = register_buffer("running_mean", at::Tensor());
    running_var = register_buffer("running_var", at::Tensor());
    num_batches_tracked = register_buffer("num_batches_tracked", at::Tensor());
  }
}

void SyncBatchNormImpl::pretty_print(std::ostream& stream) const {
  stream << "lockstep::distributed::SyncBatchNorm(" << options.num_features() << ", eps=" << options.eps()
         << ", momentum=";
  if (options.momentum()) {
    stream << *options.momentum();
  } else {
    stream << "None";
  }
  stream << ", affine=" << options.affine() << ", track_running_stats=" << options.track_running_stats() << ")";
}

at::Tensor SyncBatchNormImpl::forward(const at::Tensor& input) {
  if (input.dim() < 2 || input.size(1) != options.num_features()) {
    std::ostringstream msg;
    msg << "SyncBatchNorm(" << options.num_features() << "): expected input of shape (N, "
        << options.num_features() << ", ...), got " << input.sizes() << ".";
    throw UsageError(msg.str());
  }
  double momentum = options.momentum().value_or(0.0);
  if (is_training() && options.track_running_stats()) {
    num_batches_tracked += 1;
    if (!options.momentum()) momentum = 1.0 / num_batches_tracked.item<double>();
  }
  const bool batch_stats = is_training() || !options.track_running_stats();
  const bool synchronised = is_training() && group_ && group_->world_size() > 1;
  if (!synchronised) {
    return torch::batch_norm(input, weight, bias, running_mean, running_var, batch_stats, momentum, options.eps(),
                             /*cudnn_enabled=*/false);
  }
  return forward_synchronised(input, momentum);
}

at::Tensor SyncBatchNormImpl::forward_synchronised(const at::Tensor& input, double momentum) {
  const int64_t channels = input.size(1);
  const auto dims = reduced_dims(input);
  const double count = input.numel() == 0 ? 0.0 : static_cast<double>(input.numel() / channels);
  // Each rank's (count, mean, M2 = count * biased variance), gathered and combined exactly as
  // Chan et al.'s parallel variance: no cancellation, whatever the batch sizes.
  auto local = torch::zeros({1 + 2 * channels}, torch::kDouble);
  local[0] = count;
  if (count > 0) {
    at::Tensor var, mean;
    std::tie(var, mean) = at::var_mean(input.detach(), dims, /*unbiased=*/false);
    local.narrow(0, 1, channels).copy_(mean.to(torch::kDouble));
    local.narrow(0, 1 + channels, channels).copy_(var.to(torch::kDouble) * count);
  }
  auto stats = gather_statistics(*group_, local);  // (world, 1 + 2C)
  auto counts = stats.select(1, 0).unsqueeze(1);
  const double total = counts.sum().item<double>();
  if (total <= 1 && running_mean.defined()) {
    throw UsageError("SyncBatchNorm: expected more than 1 value per channel over all ranks when "
                                "training, got " + std::to_string(static_cast<int64_t>(total)) + ".");
  }
  auto means = stats.narrow(1, 1, channels);
  auto mean = (means * counts).sum(0) / total;
  auto m2 = (stats.narrow(1, 1 + channels, channels) + counts * (means - mean).pow(2)).sum(0);
  auto var = m2 / total;
  if (running_mean.defined()) {
    torch::NoGradGuard no_grad;
    running_mean.mul_(1 - momentum).add_(mean.to(running_mean.scalar_type()), momentum);
    running_var.mul_(1 - momentum).add_((m2 / (total - 1)).to(running_var.scalar_type()), momentum);
  }
  auto mean_f = mean.to(input.scalar_type());
  auto invstd_f = (var + options.eps()).rsqrt().to(input.scalar_type());
  auto out = SyncNormalize::apply(input, mean_f, invstd_f, total, group_);
  if (!options.affine()) return out;
  const auto shape = channel_shape(input);
  return out * weight.view(shape) + bias.view(shape);
}

namespace {

template <typename BatchNorm>
bool state_of(const std::shared_ptr<torch::nn::Module>& module, torch::nn::BatchNormOptions& options, bool& training,
              SyncBatchNormImpl::State& state) {
  auto bn = std::dynamic_pointer_cast<BatchNorm>(module);
  if (!bn) return false;
  options = bn->options;
  training = bn->is_training();
  // Its own counter (same value): the old one moving tells that the old module still runs.
  state = {bn->weight, bn->bias, bn->running_mean, bn->running_var,
           bn->num_batches_tracked.defined() ? bn->num_batches_tracked.clone() : at::Tensor()};
  return true;
}

std::shared_ptr<SyncBatchNormImpl> as_sync(const std::shared_ptr<torch::nn::Module>& module, ProcessGroup& group,
                                           const std::string& name) {
  auto sync = SyncBatchNormImpl::from_batchnorm(module, &group);
  if (!sync) return nullptr;
  sync->replaced = module;
  sync->replaced_name = name;
  const auto buffers = module->named_buffers(/*recurse=*/false);
  if (const auto* counter = buffers.find("num_batches_tracked")) {
    if (counter->defined()) {
      sync->replaced_counter = *counter;
      sync->replaced_counter_at_conversion = counter->item<int64_t>();
    }
  }
  return sync;
}

// The containers keep their own list besides the registered children: replace it there too.
void replace_in_container(torch::nn::Module& parent, const std::shared_ptr<torch::nn::Module>& old,
                          const std::shared_ptr<SyncBatchNormImpl>& sync) {
  if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(&parent)) {
    for (auto& any : *seq) {
      if (any.ptr() == old) any = torch::nn::AnyModule(sync);
    }
  } else if (auto* list = dynamic_cast<torch::nn::ModuleListImpl*>(&parent)) {
    for (auto& item : *list) {
      if (item == old) item = sync;
    }
  } else if (auto* dict = dynamic_cast<torch::nn::ModuleDictImpl*>(&parent)) {
    std::vector<std::pair<std::string, std::shared_ptr<torch::nn::Module>>> updates;
    for (const auto& item : *dict) {
      if (item.value() == old) updates.emplace_back(item.key(), sync);
    }
    dict->update(updates);
  }
}

std::shared_ptr<torch::nn::Module> convert(const std::shared_ptr<torch::nn::Module>& module, ProcessGroup& group,
                                           const std::string& name) {
  if (auto sync = as_sync(module, group, name)) return sync;
  for (const auto& child : module->named_children()) {
    const auto old = child.value();
    auto converted = convert(old, group, name.empty() ? child.key() : name + "." + child.key());
    if (converted == old) continue;
    auto sync = std::dynamic_pointer_cast<SyncBatchNormImpl>(converted);
    replace_in_container(*module, old, sync);
    module->replace_module(child.key(), converted);
  }
  return module;
}

}  // namespace

std::shared_ptr<torch::nn::Module> convert_sync_batchnorm(std::shared_ptr<torch::nn::Module> module,
                                                          ProcessGroup& group) {
  if (!module) throw UsageError("convert_sync_batchnorm: the module is null.");
  return convert(module, group, "");
}

std::shared_ptr<SyncBatchNormImpl> SyncBatchNormImpl::from_batchnorm(const std::shared_ptr<torch::nn::Module>& batchnorm,
                                                                     ProcessGroup* group) {
  torch::nn::BatchNormOptions options(1);
  bool training = true;
  State state;
  if (!state_of<torch::nn::BatchNorm1dImpl>(batchnorm, options, training, state) &&
      !state_of<torch::nn::BatchNorm2dImpl>(batchnorm, options, training, state) &&
      !state_of<torch::nn::BatchNorm3dImpl>(batchnorm, options, training, state)) {
    return nullptr;
  }
  std::shared_ptr<SyncBatchNormImpl> sync(new SyncBatchNormImpl(options, group, state));
  sync->train(training);
  return sync;
}

namespace detail {

void check_replaced_batchnorms_unused(const torch::nn::Module& module) {
  for (const auto& item : module.named_modules("", /*include_self=*/true)) {
    auto* sync = dynamic_cast<SyncBatchNormImpl*>(item.value().get());
    if (!sync || !sync->replaced_counter.defined()) continue;
    if (sync->replaced_counter.item<int64_t>() == sync->replaced_counter_at_conversion) continue;
    throw UsageError(
        "convert_sync_batchnorm replaced the BatchNorm '" + item.key() +
        "' by a SyncBatchNorm, but the model's forward still called the original BatchNorm (a typed member such "
        "as `torch::nn::BatchNorm2d bn;` keeps pointing to it; C++ cannot rebind it), so its statistics are not "
        "synchronised. Declare that member as lockstep::distributed::SyncBatchNorm (then convert_sync_batchnorm is "
        "not needed), or call it through the module tree (a Sequential, or named_children()).");
  }
}

std::vector<std::string> replaced_batchnorms_still_held(const torch::nn::Module& module) {
  std::vector<std::string> names;
  for (const auto& item : module.named_modules("", /*include_self=*/true)) {
    auto* sync = dynamic_cast<SyncBatchNormImpl*>(item.value().get());
    if (sync && !sync->replaced.expired()) names.push_back(item.key());
  }
  return names;
}

}  // namespace detail

}  // namespace distributed
}  // namespace lockstep
