// The GPT part of a job without LibTorch (see gpt_job.h).
#include "worker/gpt_job.h"

#include <algorithm>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace stagehand {
namespace {

GptSpec Preset(const std::string& name) {
  GptSpec p;
  p.set_preset(name);
  if (name == "tiny") {
    p.set_vocab(256);
    p.set_hidden(64);
    p.set_heads(4);
    p.set_layers(4);
    p.set_seq(32);
    p.set_fp32(true);
  } else {  // gpt-1.3b: ../shared/targets.md
    p.set_vocab(32768);
    p.set_hidden(2048);
    p.set_heads(16);
    p.set_layers(24);
    p.set_seq(1024);
  }
  p.set_attention("cudnn");
  return p;
}

absl::Status Invalid(const std::string& what) { return absl::InvalidArgumentError(what); }

}  // namespace

const std::vector<std::string>& GptPresetNames() {
  static const auto* names = new std::vector<std::string>{"tiny", "gpt-1.3b"};
  return *names;
}

bool IsGptModel(const std::string& model) {
  const auto& n = GptPresetNames();
  return std::find(n.begin(), n.end(), model) != n.end();
}

absl::StatusOr<GptSpec> ResolveGptSpec(const std::string& model, const GptSpec& spec) {
  if (!IsGptModel(model)) {
    return Invalid(absl::StrCat("--model=", model, ": not a GPT preset; known: ", absl::StrJoin(GptPresetNames(), ", ")));
  }
  GptSpec out = Preset(model);
  if (spec.vocab()) out.set_vocab(spec.vocab());
  if (spec.hidden()) out.set_hidden(spec.hidden());
  if (spec.heads()) out.set_heads(spec.heads());
  if (spec.layers()) out.set_layers(spec.layers());
  if (spec.seq()) out.set_seq(spec.seq());
  if (spec.fp32()) out.set_fp32(true);
  if (!spec.attention().empty()) out.set_attention(spec.attention());
  if (spec.unfused_layernorm()) out.set_unfused_layernorm(true);
  if (!IsAttentionKernel(out.attention())) {
    return Invalid(absl::StrCat("--attention=", out.attention(), ": unknown; use ", AttentionKernelChoices()));
  }
  for (auto [name, v] : {std::pair<const char*, int64_t>{"vocab", out.vocab()}, {"hidden", out.hidden()},
                         {"heads", out.heads()}, {"layers", out.layers()}, {"seq", out.seq()}}) {
    if (v < 1) return Invalid(absl::StrCat("--", name, "=", v, ": must be at least 1"));
  }
  if (out.hidden() % out.heads() != 0) {
    return Invalid(absl::StrCat("--hidden=", out.hidden(), " is not divisible by --heads=", out.heads()));
  }
  return out;
}

absl::StatusOr<std::vector<int>> ParsePartition(const std::string& text) {
  if (text.empty() || text == "auto" || text == "uniform") return std::vector<int>{};
  std::vector<int> counts;
  for (absl::string_view part : absl::StrSplit(text, ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(part, &n) || n < 1) {
      return Invalid(absl::StrCat("--partition=", text, ": expected auto, uniform, or layer counts like 27,23 "
                                  "(each at least 1; the pipeline layers are the embedding, each block's attention "
                                  "and MLP halves, and the head)"));
    }
    counts.push_back(n);
  }
  return counts;
}

int64_t MicroBatchSize(const JobSpec& job) {
  return job.pipeline().global_batch() / std::max(1, job.pipeline().micro_batches());
}

absl::Status ValidateGptJob(const JobSpec& job) {
  const PipelineSpec& p = job.pipeline();
  const int64_t layers = GptPipelineLayers(job.gpt().layers());
  if (p.stages() < 1) return Invalid("--pipeline_stages must be at least 1");
  if (p.stages() != job.workers()) {
    return Invalid(absl::StrCat("--pipeline_stages=", p.stages(), " with ", job.workers(),
                                " workers: each worker runs one stage (no data parallelism yet); make them equal"));
  }
  if (p.stages() > layers) {
    return Invalid(absl::StrCat(p.stages(), " stages but the model has only ", layers,
                                " pipeline layers (embedding, ", job.gpt().layers(),
                                " blocks of two halves, head); use at most ", layers, " stages or more --layers"));
  }
  if (p.micro_batches() < 1) return Invalid("--micro_batches must be at least 1");
  if (!p.inference() && p.schedule() != "gpipe" && p.schedule() != "1f1b") {
    return Invalid(absl::StrCat("--schedule=", p.schedule(), ": unknown; use gpipe or 1f1b"));
  }
  if (!p.inference() && p.schedule() == "1f1b" && p.micro_batches() < p.stages()) {
    return Invalid(absl::StrCat("1F1B needs at least as many micro-batches as stages (got ", p.micro_batches(), " for ",
                                p.stages(), " stages); pass --micro_batches=", p.stages(),
                                " or more, or --schedule=gpipe"));
  }
  if (p.global_batch() < 1 || p.global_batch() % p.micro_batches() != 0) {
    return Invalid(absl::StrCat("--global_batch=", p.global_batch(), " does not split into ", p.micro_batches(),
                                " equal micro-batches; pass a multiple of --micro_batches"));
  }
  absl::StatusOr<std::vector<int>> counts = ParsePartition(p.partition());
  if (!counts.ok()) return counts.status();
  if (!counts->empty()) {
    int sum = 0;
    for (int c : *counts) sum += c;
    if (static_cast<int>(counts->size()) != p.stages() || sum != layers) {
      return Invalid(absl::StrCat("--partition=", p.partition(), " lists ", counts->size(), " stages of ", sum,
                                  " layers in all, but the job has ", p.stages(), " stages and the model ", layers,
                                  " pipeline layers (embedding + 2 x ", job.gpt().layers(),
                                  " block halves + head)"));
    }
  }
  return absl::OkStatus();
}

LayerProfile EstimateGpt(const JobSpec& job) {
  const GptSpec& g = job.gpt();
  const double tokens = static_cast<double>(MicroBatchSize(job)) * g.seq();
  const double h = g.hidden(), v = g.vocab(), s = g.seq();
  const double flops_per_ms = 400e12 / 1e3;  // an assumed H100/H200-class bf16 rate; only ratios matter
  auto layer = [&](double params, double fwd_flops, double act_bytes) {
    LayerCost c;
    c.set_forward_ms(fwd_flops / flops_per_ms);
    c.set_backward_ms(2 * fwd_flops / flops_per_ms);
    c.set_param_bytes(static_cast<int64_t>(params * 16));  // fp32 parameter, gradient, two AdamW moments
    c.set_activation_bytes(static_cast<int64_t>(act_bytes));
    return c;
  };
  LayerCost costs[kGptLayerKinds];
  // The embedding is a gather: little time, but its gradient is a dense V x H scatter.
  costs[static_cast<int>(GptLayerKind::kEmbedding)] = layer(v * h, tokens * h * 10, tokens * h * 4);
  // A block's attention half (ln1, qkv, proj; matmuls + causal attention) and MLP half (ln2, fc1, fc2).
  costs[static_cast<int>(GptLayerKind::kAttention)] =
      layer(4 * h * h + 6 * h, tokens * (8 * h * h + 2 * s * h), tokens * h * 16);
  costs[static_cast<int>(GptLayerKind::kMlp)] = layer(8 * h * h + 7 * h, tokens * 16 * h * h, tokens * h * 24);
  // The head: vocabulary projection and the loss; logits in bf16 plus the fp32 loss and its gradient.
  costs[static_cast<int>(GptLayerKind::kHead)] = layer(v * h + 2 * h, tokens * 2 * v * h, tokens * v * 10);
  LayerProfile p;
  p.set_micro_batch(MicroBatchSize(job));
  for (int64_t i = 0; i < GptPipelineLayers(g.layers()); ++i) {
    *p.add_layers() = costs[static_cast<int>(GptLayerKindOf(i, g.layers()))];
  }
  return p;
}

}  // namespace stagehand
