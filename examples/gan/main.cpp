// A small DCGAN on Fashion-MNIST with manual optimisation. The generator and the discriminator
// each get their own DistributedDataParallel (`--strategy ddp_separate`, SeparateDDP): the
// discriminator step leaves the generator without gradients, which one DDP around the whole
// model rejects (try `--strategy ddp`). Rank 0 writes a PNG grid of samples after every epoch.
//   build/bin/gan --devices 2            (4 epochs; samples look like clothing from the second)
#include <cmath>
#include <filesystem>
#include <iostream>

#include <torch/torch.h>

#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_image_write.h>

#include <lockstep/cli/guarded_main.h>
#include <lockstep/cli/trainer_flags.h>
#include <lockstep/core/error.h>
#include <lockstep/data/idx_examples.h>
#include <lockstep/trainer/trainer.h>

namespace {

using namespace lockstep;
namespace nn = torch::nn;

struct Flags {
  int64_t batch_size = 64;
  double lr = 2e-4;
  int64_t latent = 64;
  int64_t width = 64;  // channels of the generator's last hidden layer and the discriminator's first
  int64_t grid = 8;  // samples per side of the PNG grid
  std::string data_dir = data::kFashionMnistDirectory;
};

// latent -> 2w x 7x7 -> w x 14x14 -> 1x28x28 in [-1, 1].
struct GeneratorImpl : nn::Module {
  GeneratorImpl(int64_t latent, int64_t w) : w(w) {
    fc = register_module("fc", nn::Linear(latent, 2 * w * 7 * 7));
    bn0 = register_module("bn0", nn::BatchNorm1d(2 * w * 7 * 7));
    up1 = register_module("up1", nn::ConvTranspose2d(nn::ConvTranspose2dOptions(2 * w, w, 4).stride(2).padding(1)));
    bn1 = register_module("bn1", nn::BatchNorm2d(w));
    up2 = register_module("up2", nn::ConvTranspose2d(nn::ConvTranspose2dOptions(w, 1, 4).stride(2).padding(1)));
  }
  torch::Tensor forward(const torch::Tensor& z) {
    auto x = torch::relu(bn0(fc(z))).view({z.size(0), 2 * w, 7, 7});
    return torch::tanh(up2(torch::relu(bn1(up1(x)))));
  }
  int64_t w;
  nn::Linear fc{nullptr};
  nn::BatchNorm1d bn0{nullptr};
  nn::ConvTranspose2d up1{nullptr}, up2{nullptr};
  nn::BatchNorm2d bn1{nullptr};
};
TORCH_MODULE(Generator);

// 1x28x28 -> w x 14x14 -> 2w x 7x7 -> one logit (real or fake).
struct DiscriminatorImpl : nn::Module {
  explicit DiscriminatorImpl(int64_t w) {
    conv1 = register_module("conv1", nn::Conv2d(nn::Conv2dOptions(1, w, 4).stride(2).padding(1)));
    conv2 = register_module("conv2", nn::Conv2d(nn::Conv2dOptions(w, 2 * w, 4).stride(2).padding(1)));
    bn2 = register_module("bn2", nn::BatchNorm2d(2 * w));
    fc = register_module("fc", nn::Linear(2 * w * 7 * 7, 1));
  }
  torch::Tensor forward(const torch::Tensor& images) {
    auto x = torch::leaky_relu(conv1(images.view({images.size(0), 1, 28, 28})), 0.2);
    x = torch::leaky_relu(bn2(conv2(x)), 0.2);
    return fc(x.flatten(1)).view({-1});
  }
  nn::Conv2d conv1{nullptr}, conv2{nullptr};
  nn::BatchNorm2d bn2{nullptr};
  nn::Linear fc{nullptr};
};
TORCH_MODULE(Discriminator);

// The DCGAN paper's initialisation: weights from N(0, 0.02), batch-norm scales from N(1, 0.02).
void dcgan_init(nn::Module& module) {
  torch::NoGradGuard no_grad;
  for (auto& item : module.named_parameters()) {
    const auto& name = item.key();
    auto& p = item.value();
    const bool batch_norm = name.find("bn") != std::string::npos;
    if (name.size() >= 4 && name.compare(name.size() - 4, 4, "bias") == 0) {
      p.zero_();
    } else {
      p.normal_(batch_norm ? 1.0 : 0.0, 0.02);
    }
  }
}

torch::Tensor bce(const torch::Tensor& logits, double label) {
  return torch::binary_cross_entropy_with_logits(logits, torch::full_like(logits, label));
}

class Gan : public TrainingModule {
 public:
  explicit Gan(const Flags& flags) : flags_(flags) {
    generator = register_module("generator", Generator(flags.latent, flags.width));
    discriminator = register_module("discriminator", Discriminator(flags.width));
    dcgan_init(*this);
    automatic_optimization(false);
    // The same noise for every grid, so the pictures show the generator changing.
    fixed_noise_ = torch::randn({flags.grid * flags.grid, flags.latent},
                                torch::make_generator<at::CPUGeneratorImpl>(1234));
    hparams() = {{"batch_size", flags.batch_size}, {"lr", flags.lr}, {"latent", flags.latent}, {"width", flags.width}};
  }

  // Each rank draws its own noise: with one seed everywhere, every rank would generate the same
  // fakes, and the global batch would hold each fake world-size times.
  void on_fit_start() override {
    const uint64_t seed = static_cast<uint64_t>(torch::randint(1 << 30, {1}).item<int64_t>());
    noise_ = torch::make_generator<at::CPUGeneratorImpl>(seed + 7919 * static_cast<uint64_t>(global_rank()));
  }

  torch::Tensor training_step(Batch& batch, int64_t) override {
    const auto& opt_g = optimizers()[0];
    const auto& opt_d = optimizers()[1];
    const auto& real = batch.data;
    auto fake = generator(torch::randn({real.size(0), flags_.latent}, noise_).to(real.device()));

    // Discriminator: real images are 1, generated ones 0. `fake` is detached, so this backward
    // reaches the discriminator only, and only its gradients are reduced.
    auto d_loss = bce(discriminator(real), 1.0) + bce(discriminator(fake.detach()), 0.0);
    opt_d->zero_grad();
    manual_backward(d_loss);
    opt_d->step();

    // Generator: make the discriminator say 1 for generated images.
    auto g_loss = bce(discriminator(fake), 1.0);
    opt_g->zero_grad();
    manual_backward(g_loss);
    opt_g->step();

    log("d_loss", d_loss, LogOptions().prog_bar(true));
    log("g_loss", g_loss, LogOptions().prog_bar(true));
    return g_loss;
  }

  OptimizerConfig configure_optimizers() override {
    auto adam = [&](const std::vector<torch::Tensor>& params) {
      return std::make_shared<torch::optim::Adam>(params, torch::optim::AdamOptions(flags_.lr).betas({0.5, 0.999}));
    };
    OptimizerConfig config;
    config.optimizers = {adam(generator->parameters()), adam(discriminator->parameters())};
    return config;
  }

  void on_train_epoch_end() override {
    if (global_rank() == 0) write_grid();
  }

  // Every rank compares its parameters with rank 0's: SeparateDDP keeps them equal. (Buffers,
  // the batch-norm statistics, are not broadcast: as with MMEditing's wrapper, each rank keeps
  // its own, updated from its own batches.)
  void on_fit_end() override {
    std::vector<torch::Tensor> flat;
    for (const auto& t : parameters()) flat.push_back(t.detach().reshape({-1}));
    const auto mine = torch::cat(flat);
    double worst = 0;
    for (const auto& other : all_gather(mine)) {
      worst = std::max(worst, (other - mine).abs().max().item<double>());
    }
    if (global_rank() == 0) {
      std::cerr << "gan: replicas " << (worst == 0 ? "identical" : "DIFFER") << " across " << world_size()
                << " process(es): max |difference| of parameters = " << worst << "\n";
    }
  }

  Generator generator{nullptr};
  Discriminator discriminator{nullptr};

 private:
  // An 8x8 grid of generated 28x28 images, white on black, as samples/epoch_N.png in the log folder.
  void write_grid() {
    // In training mode, as DCGAN samples: batch norm normalises with the grid's own statistics
    // (the running averages, mixed over a whole epoch of a changing generator, blur the samples).
    // Only rank 0's running statistics take this extra update (each rank keeps its own).
    torch::NoGradGuard no_grad;
    auto images = generator(fixed_noise_.to(device())).to(torch::kCPU);
    const int64_t n = flags_.grid, side = 28 * n;
    auto pixels = ((images.view({n, n, 28, 28}) + 1) * 127.5).clamp(0, 255).to(torch::kUInt8);
    pixels = pixels.permute({0, 2, 1, 3}).contiguous().view({side, side});
    const auto folder = std::filesystem::path(trainer()->log_dir()) / "samples";
    std::filesystem::create_directories(folder);
    const auto path = folder / ("epoch_" + std::to_string(current_epoch()) + ".png");
    if (!stbi_write_png(path.c_str(), static_cast<int>(side), static_cast<int>(side), 1, pixels.data_ptr<uint8_t>(),
                        static_cast<int>(side))) {
      throw std::runtime_error("gan: could not write " + path.string());
    }
    std::cerr << "gan: wrote " << path.string() << "\n";
  }

  Flags flags_;
  torch::Tensor fixed_noise_;
  at::Generator noise_;
};

int run(int argc, char** argv) {
  CLI::App app{"Train a small DCGAN on Fashion-MNIST, generator and discriminator each in their own DDP", "gan"};
  TrainerOptions options;
  options.max_epochs(4).strategy("ddp_separate");
  cli::add_trainer_flags(app, options);
  Flags flags;
  app.add_option("--batch-size", flags.batch_size, "examples per batch on each process")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20))->capture_default_str();
  app.add_option("--lr", flags.lr, "Adam learning rate of both parts")->check(CLI::Range(1e-12, 1.0))->capture_default_str();
  app.add_option("--latent", flags.latent, "size of the generator's noise input")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}))->capture_default_str();
  app.add_option("--width", flags.width, "channels of the generator's last and the discriminator's first layer")
      ->check(CLI::Range(int64_t{1}, int64_t{1024}))->capture_default_str();
  app.add_option("--data-dir", flags.data_dir, "folder with the *-idx?-ubyte(.gz) files")->capture_default_str();
  const int parsed = cli::parse_or_exit_code(app, argc, argv);
  if (parsed >= 0) return parsed;

  // Pixels in [-1, 1], the range of the generator's tanh.
  auto images = std::make_shared<data::IdxExamples>(
      data::IdxDatasetOptions().directory(flags.data_dir).mean(0.5).stddev(0.5));
  auto train = std::make_shared<DataLoader>(
      images, DataLoaderOptions(flags.batch_size).shuffle(true).drop_last(true).seed(options.seed() >= 0 ? options.seed() : 0));
  auto model = std::make_shared<Gan>(flags);
  Trainer trainer(options);
  trainer.fit(model, train);
  if (trainer.is_global_zero()) {
    const auto& m = trainer.callback_metrics();
    auto metric = [&](const char* name) { return m.count(name) ? m.at(name) : std::nan(""); };
    std::cerr << "gan: d_loss " << metric("d_loss") << ", g_loss " << metric("g_loss") << " after "
              << trainer.current_epoch() << " epoch(s) on " << trainer.strategy().world_size() << " process(es)\n"
              << "gan: samples and logs in " << trainer.log_dir() << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) { return lockstep::cli::guarded_main("gan", [&] { return run(argc, argv); }); }
