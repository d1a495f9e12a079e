// A training loop over a synthetic dataset: a softmax classifier learns to tell apart Gaussian
// blobs. Shows the C++ API end to end: a Dataset registered by name (so spawned workers can
// rebuild it), ferry::init, options, epochs, and per-sample randomness drawn from the
// SampleContext, so the data is the same whatever the number of workers or start method.
//
//   example_train_loop [--epochs N] [--samples N] [--batch-size N] [--workers N]
//                      [--start-method fork|forkserver|spawn] [--device cpu|cuda|cuda:N]
//                      [--checkpoint DIR [--save-every N]] [--max-steps N]
// With --device cuda the model goes to the GPU first and the loader is built after it (a fork
// loader after CUDA started is fine: workers never use CUDA); batches arrive on the GPU.
//
// With --checkpoint DIR the model and the loader's state are saved together every --save-every
// steps (100), and a run that finds a checkpoint there resumes from it: the same batches, in the
// same order, as if it had never stopped, so the final model is bitwise the uninterrupted one's.
// --max-steps stops after that many steps in all (a job's time limit, say).

#include <ferry/ferry.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>

#include <torch/serialize.h>

namespace {

constexpr std::int64_t kClasses = 4;
constexpr std::int64_t kFeatures = 16;

// Sample i belongs to class i % 4; its features are that class's centre plus noise drawn from
// the sample's own generator.
class BlobDataset : public ferry::Dataset {
 public:
  explicit BlobDataset(std::size_t size) : size_(size) {
    centres_ = torch::randn({kClasses, kFeatures}, at::detail::createCPUGenerator(1234)) *
               0.6;  // close enough that classes overlap
  }
  std::size_t size() const override { return size_; }
  ferry::Example get(std::size_t index, ferry::SampleContext& ctx) const override {
    const auto label = static_cast<std::int64_t>(index % kClasses);
    torch::Tensor features = centres_[label] + torch::randn({kFeatures}, ctx.generator());
    return {{"features", features}, {"label", label}};
  }

 private:
  std::size_t size_;
  torch::Tensor centres_;
};

std::size_t arg(int argc, char** argv, const char* name, std::size_t fallback) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return std::strtoull(argv[i + 1], nullptr, 10);
  }
  return fallback;
}

ferry::StartMethod start_method(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--start-method") != 0) continue;
    const std::string m = argv[i + 1];
    if (m == "spawn") return ferry::StartMethod::kSpawn;
    if (m == "forkserver") return ferry::StartMethod::kForkserver;
    if (m != "fork") {
      std::fprintf(stderr, "--start-method %s: expected fork, forkserver or spawn\n", m.c_str());
      std::exit(2);
    }
  }
  return ferry::StartMethod::kFork;
}

std::optional<torch::Device> device(int argc, char** argv) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], "--device") == 0) return torch::Device(argv[i + 1]);
  }
  return std::nullopt;
}

const char* text_arg(int argc, char** argv, const char* name) {
  for (int i = 1; i + 1 < argc; ++i) {
    if (std::strcmp(argv[i], name) == 0) return argv[i + 1];
  }
  return nullptr;
}

// A checkpoint is a step's model and loader state, written first, then named in `latest`
// (replaced atomically): a crash at any moment leaves the previous checkpoint whole.
struct Checkpoint {
  std::filesystem::path dir;

  std::filesystem::path model(std::size_t step) const {
    return dir / ("model-" + std::to_string(step) + ".pt");
  }
  std::filesystem::path loader(std::size_t step) const {
    return dir / ("loader-" + std::to_string(step) + ".json");
  }
  std::optional<std::size_t> latest() const {
    std::ifstream in(dir / "latest");
    std::size_t step = 0;
    if (in >> step) return step;
    return std::nullopt;
  }
  void save(std::size_t step,
            std::vector<torch::Tensor> parameters,
            const ferry::DataLoader& data) const {
    std::filesystem::create_directories(dir);
    const std::optional<std::size_t> previous = latest();
    torch::save(parameters, model(step).string());
    data.save_state(loader(step));
    const std::filesystem::path next = dir / "latest.next";
    std::ofstream(next) << step << "\n";
    std::filesystem::rename(next, dir / "latest");
    if (previous && *previous != step) {
      std::filesystem::remove(model(*previous));
      std::filesystem::remove(loader(*previous));
    }
  }
};

int train(int argc, char** argv);

}  // namespace

int main(int argc, char** argv) {
  // Register the program's own types, then ferry::init: a spawned worker runs main up to here.
  ferry::Registry::global().add_dataset(
      {.name = "blobs",
       .summary = "Gaussian blobs, 4 classes, 16 features",
       .keys = {{.name = "size", .type = ferry::ValueType::kInt, .required = true, .min = 1}}},
      [](const ferry::Args& args) {
        return std::make_shared<BlobDataset>(args.get<std::size_t>("size"));
      });
  ferry::init(argc, argv);
  try {
    return train(argc, argv);
  } catch (const c10::Error& e) {  // LibTorch's own, e.g. a CUDA device on a CPU-only LibTorch
    std::fprintf(stderr, "example_train_loop: %s\n", e.what_without_backtrace());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "example_train_loop: %s\n", e.what());
  }
  return 1;
}

namespace {

int train(int argc, char** argv) {
  const std::size_t epochs = arg(argc, argv, "--epochs", 5);
  const std::size_t samples = arg(argc, argv, "--samples", 20000);
  const std::size_t batch_size = arg(argc, argv, "--batch-size", 64);
  const std::size_t workers = arg(argc, argv, "--workers", 2);
  const ferry::StartMethod method = start_method(argc, argv);
  const std::optional<torch::Device> on = device(argc, argv);
  if (on && on->is_cuda() && !at::hasCUDA()) {
    std::fprintf(stderr,
                 "example_train_loop: --device %s needs a CUDA LibTorch and a GPU; this LibTorch "
                 "has no CUDA or sees no GPU (Debian's libtorch-dev is CPU-only)\n",
                 on->str().c_str());
    return 2;
  }
  const auto model_options = torch::TensorOptions().device(on.value_or(torch::kCPU));

  // The model first (on the GPU with --device cuda), then the loader, as most training programs do.
  torch::Tensor weight = torch::zeros({kFeatures, kClasses}, model_options).requires_grad_();
  torch::Tensor bias = torch::zeros({kClasses}, model_options).requires_grad_();
  const double lr = 0.1;

  auto dataset = ferry::Registry::global().make_dataset(
      ferry::Config::map({{"type", "blobs"}, {"size", samples}}));
  ferry::DataLoader loader(dataset,
                           {.batch_size = batch_size,
                            .shuffle = true,
                            .num_workers = workers,
                            .seed = 0,
                            .start_method = workers > 0 ? std::optional(method) : std::nullopt,
                            .device = on});

  const std::size_t max_steps = arg(argc, argv, "--max-steps", SIZE_MAX);
  const std::size_t save_every = arg(argc, argv, "--save-every", 100);
  std::optional<Checkpoint> checkpoint;
  if (const char* dir = text_arg(argc, argv, "--checkpoint")) checkpoint = Checkpoint{dir};
  std::size_t steps = 0;  // in all, over every run that resumed this one
  if (checkpoint) {
    if (const std::optional<std::size_t> step = checkpoint->latest()) {
      std::vector<torch::Tensor> parameters;
      torch::load(parameters, checkpoint->model(*step).string());
      {
        at::NoGradGuard no_grad;
        weight.copy_(parameters.at(0));
        bias.copy_(parameters.at(1));
      }
      loader.load_state_file(checkpoint->loader(*step));
      steps = *step;
      std::printf("resumed from %s at step %zu (epoch %llu)\n", checkpoint->dir.c_str(), steps,
                  static_cast<unsigned long long>(loader.epoch()));
    }
  }

  std::printf(
      "ferry %s: training a %lld-class softmax classifier on %zu synthetic samples, "
      "batch_size=%zu, num_workers=%zu, start_method=%s, device=%s, %zu batches per epoch\n",
      FERRY_VERSION, static_cast<long long>(kClasses), samples, batch_size, workers,
      std::string(ferry::to_string(method)).c_str(), on ? on->str().c_str() : "cpu", loader.size());
  while (loader.epoch() < epochs && steps < max_steps) {
    const std::size_t epoch = loader.epoch();
    const auto start = std::chrono::steady_clock::now();
    double loss_sum = 0;
    std::int64_t correct = 0, seen = 0;
    std::size_t step = 0;
    for (auto& batch : loader) {
      const torch::Tensor& x = batch["features"];
      const torch::Tensor& y = batch["label"];
      torch::Tensor logits = x.matmul(weight) + bias;
      torch::Tensor loss = at::cross_entropy_loss(logits, y);
      loss.backward();
      {
        at::NoGradGuard no_grad;
        weight -= lr * weight.grad();
        bias -= lr * bias.grad();
        weight.mutable_grad().zero_();
        bias.mutable_grad().zero_();
        correct += logits.argmax(1).eq(y).sum().item<std::int64_t>();
      }
      loss_sum += loss.item<double>() * static_cast<double>(batch.size());
      seen += static_cast<std::int64_t>(batch.size());
      if (++step % 100 == 0) {
        std::printf("  epoch %zu  batch %zu/%zu  loss %.4f\n", epoch, step, loader.size(),
                    loss.item<double>());
      }
      ++steps;
      // The loader's state says what this step consumed: saved with the model after the step.
      if (checkpoint && steps % save_every == 0) checkpoint->save(steps, {weight, bias}, loader);
      if (steps >= max_steps) break;
    }
    if (seen == 0) continue;
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf("epoch %zu: loss %.4f  accuracy %.1f%%  %lld samples in %.2f s (%.0f samples/s)\n",
                epoch, loss_sum / static_cast<double>(seen),
                100.0 * static_cast<double>(correct) / static_cast<double>(seen),
                static_cast<long long>(seen), seconds, static_cast<double>(seen) / seconds);
  }
  // A fingerprint of the model's bytes: an interrupted and resumed run ends with the same one.
  std::uint64_t hash = 14695981039346656037ull;
  for (const torch::Tensor& t : {weight, bias}) {
    const torch::Tensor cpu = t.detach().to(torch::kCPU).contiguous();
    const auto* bytes = static_cast<const unsigned char*>(cpu.data_ptr());
    for (std::size_t i = 0; i < cpu.nbytes(); ++i) hash = (hash ^ bytes[i]) * 1099511628211ull;
  }
  std::printf("after %zu steps: model fingerprint %016llx\n", steps,
              static_cast<unsigned long long>(hash));
  return 0;
}

}  // namespace
