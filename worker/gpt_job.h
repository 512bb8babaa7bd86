// The GPT part of a job, without LibTorch (the launcher uses it): preset sizes, validation before
// anything starts, and analytic per-layer costs for checks before any worker has profiled.
#ifndef STAGEHAND_WORKER_GPT_JOB_H_
#define STAGEHAND_WORKER_GPT_JOB_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "protos/job.pb.h"
#include "worker/gpt_layers.h"

namespace stagehand {

// The GPT presets, by model name: "tiny" and "gpt-1.3b".
const std::vector<std::string>& GptPresetNames();
bool IsGptModel(const std::string& model);

// The job's GptSpec with every size filled in: the preset's, where the spec leaves a field zero.
absl::StatusOr<GptSpec> ResolveGptSpec(const std::string& model, const GptSpec& spec);

// Checks sizes, stages against layers, schedule against micro-batches, the batch split, and the
// partition text. INVALID_ARGUMENT saying what to change. `job.gpt` must be resolved.
absl::Status ValidateGptJob(const JobSpec& job);

// Parses --partition: "auto", "uniform", or comma-separated pipeline-layer counts.
absl::StatusOr<std::vector<int>> ParsePartition(const std::string& text);

// Analytic costs per pipeline layer (gpt_layers.h): time in "ms" proportional to FLOPs at an assumed
// 400 TFLOP/s, memory from the shapes. For the memory check before spawning and as the plan
// when profiling is unavailable.
LayerProfile EstimateGpt(const JobSpec& job);

// Sequences per micro-batch.
int64_t MicroBatchSize(const JobSpec& job);

}  // namespace stagehand

#endif  // STAGEHAND_WORKER_GPT_JOB_H_
