// A tiny real model for engine tests, on the CPU in fp32: pipeline layer 0 embeds tokens, the middle
// layers are x + tanh(x W), the last is a linear head to the vocabulary. A FakeStage holds a range of
// layers and records the calls the engine makes on it.
#ifndef STAGEHAND_ENGINE_FAKE_STAGE_H_
#define STAGEHAND_ENGINE_FAKE_STAGE_H_

#include <ATen/CPUGeneratorImpl.h>
#include <torch/torch.h>

#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/stage.h"

namespace stagehand {

struct FakeModel {
  int64_t vocab = 13;
  int64_t hidden = 8;
  int64_t seq = 6;
  int num_layers = 4;  // at least 2: the embedding and the head
  uint64_t seed = 7;
};

// One call the engine made. `microbatch` is what the stage's identify function said of the forward's
// input (-1 without one); a backward or loss carries its forward's.
struct FakeCall {
  char kind = '?';  // 'F' forward, 'L' loss, 'B' backward
  int microbatch = -1;
  bool operator==(const FakeCall& o) const { return kind == o.kind && microbatch == o.microbatch; }
};
inline std::string ToString(const FakeCall& c) { return std::string(1, c.kind) + std::to_string(c.microbatch); }
inline std::string ToString(const std::vector<FakeCall>& calls) {
  std::string out;
  for (const FakeCall& c : calls) out += (out.empty() ? "" : " ") + ToString(c);
  return out;
}

class FakeStage : public Stage {
 public:
  // Layers [first_layer, last_layer) of `model`. Each layer's parameters come from a generator seeded
  // with (seed, layer) only, so that any split of the model starts from the same values.
  FakeStage(const FakeModel& model, int first_layer, int last_layer)
      : m_(model), first_(first_layer), last_(last_layer) {
    for (int l = first_; l < last_; ++l) {
      at::Generator gen = at::detail::createCPUGenerator(m_.seed * 1000003 + l);
      auto randn = [&gen](std::vector<int64_t> sizes, double scale) {
        return (torch::randn(sizes, gen, torch::kFloat32) * scale).requires_grad_(true);
      };
      const double inv = 1.0 / std::sqrt(static_cast<double>(m_.hidden));
      if (l == 0) {
        Add(l, "embedding", randn({m_.vocab, m_.hidden}, 1.0));
      } else if (l == m_.num_layers - 1) {
        Add(l, "weight", randn({m_.hidden, m_.vocab}, inv));
        Add(l, "bias", randn({m_.vocab}, 0.1));
      } else {
        Add(l, "weight", randn({m_.hidden, m_.hidden}, inv));
      }
    }
  }

  // Says which micro-batch a Forward input is (-1: unknown), for the record and for throw_on_forward.
  void set_identify(std::function<int(const torch::Tensor&)> identify) { identify_ = std::move(identify); }
  // Forward throws c10::Error on this micro-batch (as identified), as a model's bug would.
  void set_throw_on_forward(int microbatch) { throw_on_forward_ = microbatch; }
  const std::vector<FakeCall>& calls() const { return calls_; }
  std::vector<char> kinds() const {
    std::vector<char> out;
    for (const FakeCall& c : calls_) out.push_back(c.kind);
    return out;
  }

  TensorSpec Input(int64_t batch) const override {
    if (first_ == 0) return {{batch, m_.seq}, torch::kInt64};
    return {{batch, m_.seq, m_.hidden}, torch::kFloat32};
  }
  TensorSpec Output(int64_t batch) const override {
    return {{batch, m_.seq, last_ == m_.num_layers ? m_.vocab : m_.hidden}, torch::kFloat32};
  }

  torch::Tensor Forward(const torch::Tensor& input) override {
    const int mb = identify_ ? identify_(input) : -1;
    calls_.push_back({'F', mb});
    TORCH_CHECK(mb < 0 || mb != throw_on_forward_, "fake stage: forward of micro-batch ", mb,
                " fails as the test asked");
    torch::Tensor x = input;
    for (int l = first_; l < last_; ++l) {
      const std::vector<torch::Tensor>& p = layers_.at(l);
      if (l == 0) {
        x = torch::embedding(p[0], x);
      } else if (l == m_.num_layers - 1) {
        x = torch::matmul(x, p[0]) + p[1];
      } else {
        x = x + torch::tanh(torch::matmul(x, p[0]));
      }
    }
    Remember(x, mb);
    return x;
  }

  torch::Tensor Loss(const torch::Tensor& output, const torch::Tensor& targets) override {
    const int mb = Recall(output);
    calls_.push_back({'L', mb});
    torch::Tensor loss = Stage::Loss(output, targets);
    Remember(loss, mb);
    return loss;
  }

  void Backward(const torch::Tensor& output, const torch::Tensor& grad_output) override {
    calls_.push_back({'B', Recall(output)});
    Stage::Backward(output, grad_output);
  }

  std::vector<torch::Tensor> Parameters() override {
    std::vector<torch::Tensor> out;
    for (auto& [name, p] : named_) out.push_back(p);
    return out;
  }
  std::vector<std::pair<std::string, torch::Tensor>> NamedParameters() override { return named_; }

 private:
  void Add(int layer, const std::string& name, torch::Tensor p) {
    layers_[layer].push_back(p);
    named_.emplace_back("layers." + std::to_string(layer) + "." + name, p);
  }
  // Micro-batches are told apart in Backward and Loss by the autograd node of the tensor they get (the
  // engine may divide the loss first: then the node one step back).
  void Remember(const torch::Tensor& t, int mb) {
    if (t.grad_fn()) nodes_[t.grad_fn().get()] = {t.grad_fn(), mb};
  }
  int Recall(const torch::Tensor& t) const {
    const torch::autograd::Node* node = t.grad_fn().get();
    for (int depth = 0; node != nullptr && depth < 2; ++depth) {
      auto it = nodes_.find(node);
      if (it != nodes_.end()) return it->second.second;
      node = node->num_outputs() > 0 ? node->next_edge(0).function.get() : nullptr;
    }
    return -1;
  }

  const FakeModel m_;
  const int first_, last_;
  std::map<int, std::vector<torch::Tensor>> layers_;
  std::vector<std::pair<std::string, torch::Tensor>> named_;
  std::function<int(const torch::Tensor&)> identify_;
  int throw_on_forward_ = -1;
  std::vector<FakeCall> calls_;
  // Held so that a node's address is not reused while it is in the map.
  std::map<const torch::autograd::Node*, std::pair<std::shared_ptr<torch::autograd::Node>, int>> nodes_;
};

}  // namespace stagehand

#endif  // STAGEHAND_ENGINE_FAKE_STAGE_H_
