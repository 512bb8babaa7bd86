// The LibTorch side of "mlp-lm" (see mlp_lm_family.h). Forward may throw c10::Error; the engine turns
// it into a Status naming the action.
#include "examples/custom_model/mlp_lm_family.h"

#include <torch/torch.h>

#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/stage.h"
#include "examples/custom_model/mlp_lm_description.h"
#include "nn/nn.h"

namespace stagehand::examples {
namespace {

struct Sizes {
  int64_t vocab, hidden, width, blocks, seq;
  bool bf16;  // bf16 autocast on CUDA (ModelSpec.fp32 unset)
};

// One pipeline layer. Each draws its parameters from LayerGenerator(seed, its layer index) alone, so a
// stage holding layers [a, b) has exactly the parameters those layers have in the whole model.
class LayerImpl : public torch::nn::Module {
 public:
  virtual torch::Tensor forward(const torch::Tensor& x) = 0;
};

class EmbeddingImpl : public LayerImpl {
 public:
  EmbeddingImpl(const Sizes& s, uint64_t seed) {
    weight_ = register_parameter("weight", torch::empty({s.vocab, s.hidden}));
    at::Generator gen = LayerGenerator(seed, 0);
    torch::NoGradGuard no_grad;
    weight_.normal_(0.0, 0.02, gen);
  }
  torch::Tensor forward(const torch::Tensor& tokens) override {
    TORCH_CHECK(tokens.dim() == 2 && tokens.scalar_type() == torch::kLong,
                "mlp-lm's first stage takes token ids [B, S] int64, got ", tokens.sizes(), " ", tokens.scalar_type());
    return torch::embedding(weight_, tokens);
  }

 private:
  torch::Tensor weight_;
};

// x + W2 gelu(W1 x). W2 starts small (GPT-2's 1/sqrt(2 K)) so the residual stream does not grow with K.
class BlockImpl : public LayerImpl {
 public:
  BlockImpl(const Sizes& s, int layer, uint64_t seed) : hidden_(s.hidden) {
    fc1_ = register_module("fc1", Dense(s.hidden, s.width, true));
    fc2_ = register_module("fc2", Dense(s.width, s.hidden, true));
    at::Generator gen = LayerGenerator(seed, layer);
    fc1_->InitWeight(0.02, gen);
    fc2_->InitWeight(0.02 / std::sqrt(2.0 * s.blocks), gen);
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    TORCH_CHECK(x.dim() == 3 && x.size(2) == hidden_, "an mlp-lm block takes [B, S, ", hidden_, "], got ", x.sizes());
    return x + fc2_(at::gelu(fc1_(x)));
  }

 private:
  int64_t hidden_;
  Dense fc1_{nullptr}, fc2_{nullptr};
};

class HeadImpl : public LayerImpl {
 public:
  HeadImpl(const Sizes& s, int layer, uint64_t seed) : hidden_(s.hidden) {
    proj_ = register_module("proj", Dense(s.hidden, s.vocab, false));
    at::Generator gen = LayerGenerator(seed, layer);
    proj_->InitWeight(0.02, gen);
  }
  torch::Tensor forward(const torch::Tensor& x) override {
    TORCH_CHECK(x.dim() == 3 && x.size(2) == hidden_, "the mlp-lm head takes [B, S, ", hidden_, "], got ", x.sizes());
    return proj_(x);
  }

 private:
  int64_t hidden_;
  Dense proj_{nullptr};
};

std::shared_ptr<LayerImpl> MakeLayer(const Sizes& s, int layer, uint64_t seed) {
  if (layer == 0) return std::make_shared<EmbeddingImpl>(s, seed);
  if (layer == s.blocks + 1) return std::make_shared<HeadImpl>(s, layer, seed);
  return std::make_shared<BlockImpl>(s, layer, seed);
}

// Layers [first, last) behind the engine's interface. The head's loss is Stage's default
// (LanguageModelLoss): mean token cross-entropy of the logits against the next tokens.
class MlpLmStage final : public Stage {
 public:
  MlpLmStage(const Sizes& s, const StageOptions& o) : sizes_(s), first_(o.first()), last_(o.last()) {
    for (int i = o.first_layer; i < o.last_layer; ++i) {
      // Names carry the model's layer index, so checkpoints do not depend on the partition.
      layers_.push_back(root_->register_module(absl::StrCat("layer", i), MakeLayer(s, i, o.seed)));
    }
    root_->to(o.device);
  }
  TensorSpec Input(int64_t batch) const override {
    if (first_) return {{batch, sizes_.seq}, torch::kInt64};
    return {{batch, sizes_.seq, sizes_.hidden}, torch::kFloat32};
  }
  TensorSpec Output(int64_t batch) const override {
    return {{batch, sizes_.seq, last_ ? sizes_.vocab : sizes_.hidden}, torch::kFloat32};
  }
  torch::Tensor Forward(const torch::Tensor& input) override {
    std::optional<CudaBf16Autocast> autocast;
    if (sizes_.bf16 && input.is_cuda()) autocast.emplace();
    torch::Tensor x = input;
    for (auto& layer : layers_) x = layer->forward(x);
    // Stages exchange fp32 (what Output promises); the loss upcasts the logits itself.
    return last_ ? x : x.to(torch::kFloat32);
  }
  std::vector<torch::Tensor> Parameters() override { return root_->parameters(); }
  std::vector<std::pair<std::string, torch::Tensor>> NamedParameters() override {
    std::vector<std::pair<std::string, torch::Tensor>> out;
    for (const auto& item : root_->named_parameters()) out.emplace_back(item.key(), item.value());
    return out;
  }
  void SetTraining(bool training) override { root_->train(training); }
  // CUDA graphs replay the bf16 weight copies without the code that refreshes them.
  void PrepareForGraphs() override {
    if (sizes_.bf16) RefreshDenseCasts(*root_, at::kBFloat16);
  }

 private:
  Sizes sizes_;
  bool first_, last_;
  std::shared_ptr<torch::nn::Module> root_ = std::make_shared<torch::nn::Module>();
  std::vector<std::shared_ptr<LayerImpl>> layers_;
};

class MlpLmFamily final : public ModelFamily {
 public:
  const ModelDescription& description() const override { return MlpLmDescription(); }
  absl::StatusOr<std::unique_ptr<Stage>> MakeStage(const StageOptions& o) const override {
    // Resolve here too: the checks and the preset's sizes hold on the worker whatever the launcher did.
    absl::StatusOr<ModelSpec> m = description().Resolve(o.job->model(), o.job->model_spec());
    if (!m.ok()) return m.status();
    const int layers = description().NumLayers(*m);
    if (o.first_layer < 0 || o.first_layer >= o.last_layer || o.last_layer > layers) {
      return absl::InvalidArgumentError(absl::StrCat("an mlp-lm stage holds layers [first, last) of 0..", layers,
                                                     ", got [", o.first_layer, ", ", o.last_layer, ")"));
    }
    absl::StatusOr<int64_t> width = MlpLmWidth(*m);
    if (!width.ok()) return width.status();
    const Sizes s{m->vocab(), m->hidden(), *width, m->layers(), m->seq(), !m->fp32()};
    return std::unique_ptr<Stage>(std::make_unique<MlpLmStage>(s, o));
  }
};

}  // namespace

std::unique_ptr<ModelFamily> MakeMlpLmFamily() { return std::make_unique<MlpLmFamily>(); }

}  // namespace stagehand::examples
