// The job flags (job_flags.h): the one definition of each, for the launcher and the client.
#include "launcher/job/job_flags.h"

#include <optional>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "launcher/coordinator/liveness.h"

ABSL_FLAG(int, gpus, -1, "GPUs to use, one worker each: the first N visible (default: all visible; "
                         "with none visible, 2 CPU workers)");
ABSL_FLAG(std::string, device, "auto", "auto (GPUs when any is visible, else CPU workers), cuda or cpu");
ABSL_FLAG(int, workers, -1, "number of CPU workers with --device=cpu (default 2; at most what the machine's memory "
                             "holds at 256 MiB each and 8 per core; a warning beyond the cores)");
ABSL_FLAG(int64_t, steps, -1, "steps to run (default 10; 200 for the bare CPU run, 30 for the bare GPU run)");
ABSL_FLAG(std::string, model, "", "what the job trains (or runs, --inference) as a pipeline: tiny or gpt-1.3b "
                                  "(GPT), llama-tiny or tinyllama-1.1b (Llama), a family of --worker_binary's; "
                                  "or allreduce, a checked all-reduce of --tensor_elements floats per step "
                                  "(default: tiny on CPU workers, gpt-1.3b on GPUs)");
ABSL_FLAG(int64_t, tensor_elements, -1, "elements of the all-reduced tensor (default 1048576)");
ABSL_FLAG(int64_t, seed, -1, "random seed (default 0)");
ABSL_FLAG(std::string, job, "", "a JobSpec in protobuf text format (protos/job.proto); every flag you type "
                               "overrides its field, bools too (--timing=false over timing: true)");
ABSL_FLAG(int64_t, heartbeat_timeout_ms, -1,
          absl::StrCat("a worker silent this long (after its assignment) is dead (default ",
                       stagehand::kDefaultHeartbeatTimeoutMs, "; launcher/coordinator/liveness.h)"));
ABSL_FLAG(int64_t, progress_timeout_ms, -1, "a run with no finished step for this long is stalled (default 300000)");
ABSL_FLAG(int64_t, register_timeout_ms, -1, "every worker must register within this (default 60000)");
ABSL_FLAG(int64_t, nccl_init_timeout_ms, -1, "communicator setup deadline (default 60000)");
ABSL_FLAG(int, pipeline_stages, -1, "model: pipeline stages, one per worker (default: the worker count)");
ABSL_FLAG(std::string, schedule, "",
          "model: gpipe, 1f1b, interleaved-1f1b (--stage_chunks per worker), zb-h1 or zb-v (zero-bubble; two "
          "chunks per worker in a V) (default 1f1b)");
ABSL_FLAG(int, stage_chunks, -1,
          "model: model chunks per worker, virtual stages r, r+p, ... (interleaved-1f1b, default 2; zb-v: 2; else 1)");
ABSL_FLAG(int, micro_batches, -1, "model: micro-batches per step (default max(8, stages); at most 1024, and stages x "
                                   "chunks per worker x micro-batches at most 4096)");
ABSL_FLAG(int64_t, global_batch, -1, "model: sequences per step (default 32)");
ABSL_FLAG(std::string, partition, "", "model: auto (profiled, balanced), uniform, or pipeline-layer counts like 27,23 (the embedding, each block's attention and MLP halves, the head)");
ABSL_FLAG(int64_t, vocab, -1, "model: vocabulary size (default: the preset's)");
ABSL_FLAG(int64_t, hidden, -1, "model: hidden size (default: the preset's)");
ABSL_FLAG(int64_t, heads, -1, "GPT and Llama: attention heads (default: the preset's)");
ABSL_FLAG(int64_t, kv_heads, -1, "Llama: key/value heads of grouped-query attention (default: the preset's)");
ABSL_FLAG(int64_t, ffn_hidden, -1, "Llama: the SwiGLU MLP's inner width (default: the preset's)");
ABSL_FLAG(std::vector<std::string>, model_option, {},
          "KEY=VALUE model settings (comma-separated): for a model family of your own worker binary; for "
          "gpt and llama NAME=true|false, where false turns off one fused path: fused_norm_backward, "
          "fused_cross_entropy, fused_residual_grad, fused_residual_gemm, fused_embedding_grad (both); "
          "fused_qkv_grad, fused_bias_grad, fused_gelu, fused_gelu_gemm (GPT); fused_rotary, fused_swiglu "
          "(Llama); fused_optimizer, inference_bf16_weights, deferred_wgrad (the engine's); "
          "cutlass_residual_gemm=false runs the residual GEMM as cuBLASLt's, not ours (both)");
ABSL_FLAG(std::string, schedule_file, "",
          "a pipeline schedule as data: one line of actions per rank (\"0F0 0SEND_F0 ...\", see schedule/schedule.h)");
ABSL_FLAG(int64_t, layers, -1, "model: layers, transformer blocks for GPT and Llama (default: the preset's)");
ABSL_FLAG(int64_t, seq, -1, "model: sequence length (default: the preset's; at most 131072)");
ABSL_FLAG(bool, fp32, false, "model: no bf16 autocast");
ABSL_FLAG(bool, fused_layernorm, true,
          "GPT and Llama on GPUs: each norm that feeds a GEMM (GPT's LayerNorm, Llama's RMSNorm) writes its bf16 "
          "output in one kernel of ours (false: ATen's fp32 norm, then a cast, as PyTorch's autocast runs it)");
ABSL_FLAG(std::string, attention, "",
          "GPT and Llama on GPUs: the attention kernel, cudnn (default; cuDNN's fused attention), flash "
          "(FlashAttention-2), or torch (LibTorch's own choice, as PyTorch makes it)");
ABSL_FLAG(std::string, data, "", "model: a file of uint16 tokens (nanoGPT layout); default: the synthetic corpus");
ABSL_FLAG(double, lr, -1, "model: AdamW learning rate, finite, 0 < lr <= 10 (default: the preset's, 3e-3 for tiny and "
          "llama-tiny, 1e-4 for gpt-1.3b, tinyllama-1.1b and other families)");
ABSL_FLAG(bool, inference, false, "model: forward-only pipeline over --global_batch sequences per step");
ABSL_FLAG(bool, save_params, false, "model: each rank writes its final parameters to the run directory");
ABSL_FLAG(bool, timing, true, "workers time every action (for report.json and trace.json)");
ABSL_FLAG(bool, telemetry, true,
          "GPU workers sample their GPU's clocks, power, temperature and throttle reasons through NVML (10 Hz) "
          "for steps.csv, report.json and trace.json");
ABSL_FLAG(std::string, health, "",
          "the GPU health gate before the first step: warn (default; a GPU with uncorrected ECC errors or "
          "pending remaps is refused, throttling at rest, a degraded PCIe link or no peer access warned), "
          "strict (warnings refuse too) or off");
ABSL_FLAG(bool, cuda_graphs, true,
          "on GPUs, 1F1B and inference stages replay each micro-batch's forward and backward as CUDA graphs "
          "captured once (after step 0), which takes the CPU's launch cost off small micro-batches");
ABSL_FLAG(bool, init_on_device, true,
          "on GPUs, stages draw their parameters on the device from per-layer device generators (false: on the "
          "CPU, then copied over, which takes seconds for gpt-1.3b; the two draw different numbers)");
ABSL_FLAG(bool, prebuild_attention, true,
          "GPU workers build cuDNN's attention kernels for the model's shapes on threads of their own while the "
          "rest of the worker starts (on a machine whose CUDA driver has not cached them yet their JIT is 1-2 s "
          "of step 0); false: step 0 builds them");
ABSL_FLAG(bool, profile_cache, true,
          "workers reuse the layer profile cached per model, sizes, micro-batch and GPU name under "
          "$XDG_CACHE_HOME/stagehand/profiles (default ~/.cache/...); false: measure it every run");
ABSL_FLAG(bool, profile_single_stage, false,
          "profile the model's layers even when the job has one stage and so no partition to choose");
ABSL_FLAG(bool, partition_clocks, true,
          "--partition=auto on GPUs with telemetry weighs each GPU's SM clock under load (time ~ 1/clock): a GPU "
          "that runs slower gets less work; the end of the run puts each rank's predicted compute beside the "
          "measured (false: every rank priced at the mean profile)");
ABSL_FLAG(bool, prefetch_libraries, true,
          "workers record the library pages their first step touched (under $XDG_CACHE_HOME/stagehand/readahead, "
          "default ~/.cache/...) and the next launch reads them ahead in the background before it spawns "
          "workers, for a faster start on a cold page cache (false: neither)");
ABSL_FLAG(int, data_parallel, -1,
          "replicas of the pipeline (workers = --pipeline_stages x this; default: workers / stages); each "
          "stage's gradients are averaged over its replicas in buckets, beside the last backward");
ABSL_FLAG(bool, shard_optimizer, false,
          "with --data_parallel: ZeRO stage 1, each replica keeps and steps 1/D of the AdamW state "
          "(reduce-scatter the gradients, all-gather the parameters)");
ABSL_FLAG(std::string, layout, "",
          "manual (default: the stages, replicas, schedule and micro-batches as given) or auto (chosen by "
          "simulated step time from the model's costs, memory and --replica_gbps; the best three are printed)");
ABSL_FLAG(std::string, layout_profiles, "",
          "--layout=auto: plan from these recorded layer profiles (LayerProfile text files, comma-separated, one "
          "per micro-batch size; two or more sizes fit each layer a fixed cost) instead of the model's estimate");
ABSL_FLAG(double, bucket_mb, -1, "with --data_parallel: gradient bucket size in MiB (default 25 on GPUs, 1 on CPUs)");
ABSL_FLAG(double, replica_gbps, -1,
          "--layout=auto: the bandwidth of the replicas' all-reduce in GB/s (default 285 on GPUs, as measured on "
          "2 x H200, 1 on CPUs)");
ABSL_FLAG(int64_t, grace_period_ms, -1, "between SIGTERM and SIGKILL when stopping workers (default 3000)");
ABSL_FLAG(int64_t, checkpoint_every, -1, "model: write a checkpoint every N steps and at the end, into "
                                         "<run_dir>/checkpoints/ (asynchronous; default: none)");
ABSL_FLAG(int, keep_checkpoints, -1, "model: keep the newest N complete checkpoints (default 2)");
ABSL_FLAG(std::string, resume, "", "model: continue from the newest complete checkpoint of this run directory (any "
                                   "stage count, partition or worker count); the new run has its own --run_dir. The "
                                   "job carries on: its model and sizes, optimizer, lr schedule, batch, seed, data, "
                                   "steps and checkpointing come from the run; typed flags win (a change of the "
                                   "trajectory is said in one line; a change of the model or its sizes is refused)");
ABSL_FLAG(std::string, export_dir, "",
          "at the end of the run, write the model's weights (fp32 safetensors and config.json) into this new "
          "directory: Hugging Face's LlamaForCausalLM layout for llama, tools/peer/gpt_peer.py's for gpt "
          "(docs/export.md); with --resume and no --steps: export that checkpoint without training");
ABSL_FLAG(std::string, init_from, "",
          "start training or --inference from the weights of an --export_dir (or Hugging Face Llama) "
          "directory, any stage count; its config.json must match the model's sizes");
ABSL_FLAG(int, max_restarts, -1, "after a worker fails, restart every worker from the newest checkpoint, up to N "
                                 "times (default 0)");
ABSL_FLAG(int64_t, warmup_steps, -1, "model: linear learning-rate warm-up over N steps, then a cosine decay to --min_lr "
                                     "(default: a constant --lr unless --warmup_steps, --lr_decay_steps or --min_lr is set)");
ABSL_FLAG(int64_t, lr_decay_steps, -1, "model: the step the cosine decay reaches --min_lr (default: --steps)");
ABSL_FLAG(double, min_lr, -1, "model: the learning rate's floor, 0 <= X <= 10 (default --lr / 10 with a schedule)");
ABSL_FLAG(double, weight_decay, -1, "model: AdamW's decoupled weight decay, 0 <= X <= 10 (default 0.1)");
ABSL_FLAG(double, grad_clip, -1, "model: clip the global gradient norm (across all stages) to X > 0 (default: no clipping)");
ABSL_FLAG(double, val_fraction, -1,
          "hold out the last F of --data (0 <= F < 1, rounded down to whole sequences of --seq + 1 tokens) and never "
          "train on it; evaluated every --eval_every steps and at the end: val_loss and ppl in the progress lines, "
          "steps.csv and report.json (default 0: none)");
ABSL_FLAG(int64_t, eval_every, -1, "with --val_fraction: evaluate every N steps and at the end (default: --steps / 10)");
ABSL_FLAG(int, eval_batches, -1,
          "with --val_fraction: global batches of the split per evaluation, the same ones each time (default 4)");
ABSL_FLAG(int64_t, term_checkpoint_timeout_ms, -1,
          "with --checkpoint_every: on SIGTERM/SIGHUP every rank writes a checkpoint at the next step boundary and "
          "the launcher waits this long for it, then exits 75 (default 120000; 0: stop at once, no checkpoint)");

namespace stagehand {
namespace {

template <typename T>
std::optional<T> Given(const ParsedFlags& p, const char* name, const absl::Flag<T>& flag) {
  if (p.given.count(name) == 0) return std::nullopt;
  return absl::GetFlag(flag);
}

}  // namespace

JobRequest JobRequestFromFlags(const ParsedFlags& p) {
  JobRequest j;
  j.job_file = absl::GetFlag(FLAGS_job);
  j.gpus = Given(p, "gpus", FLAGS_gpus);
  if (p.given.count("device")) j.device = absl::GetFlag(FLAGS_device);
  j.workers = Given(p, "workers", FLAGS_workers);
  j.steps = Given(p, "steps", FLAGS_steps);
  j.model = absl::GetFlag(FLAGS_model);
  j.tensor_elements = Given(p, "tensor_elements", FLAGS_tensor_elements);
  j.seed = Given(p, "seed", FLAGS_seed);
  j.heartbeat_timeout_ms = Given(p, "heartbeat_timeout_ms", FLAGS_heartbeat_timeout_ms);
  j.progress_timeout_ms = Given(p, "progress_timeout_ms", FLAGS_progress_timeout_ms);
  j.register_timeout_ms = Given(p, "register_timeout_ms", FLAGS_register_timeout_ms);
  j.nccl_init_timeout_ms = Given(p, "nccl_init_timeout_ms", FLAGS_nccl_init_timeout_ms);
  j.grace_ms = Given(p, "grace_period_ms", FLAGS_grace_period_ms);
  j.pipeline_stages = Given(p, "pipeline_stages", FLAGS_pipeline_stages);
  j.schedule = absl::GetFlag(FLAGS_schedule);
  j.micro_batches = Given(p, "micro_batches", FLAGS_micro_batches);
  j.stage_chunks = Given(p, "stage_chunks", FLAGS_stage_chunks);
  j.global_batch = Given(p, "global_batch", FLAGS_global_batch);
  j.partition = absl::GetFlag(FLAGS_partition);
  j.vocab = Given(p, "vocab", FLAGS_vocab);
  j.hidden = Given(p, "hidden", FLAGS_hidden);
  j.heads = Given(p, "heads", FLAGS_heads);
  j.kv_heads = Given(p, "kv_heads", FLAGS_kv_heads);
  j.ffn_hidden = Given(p, "ffn_hidden", FLAGS_ffn_hidden);
  for (const std::string& kv : absl::GetFlag(FLAGS_model_option)) {
    const size_t eq = kv.find('=');
    j.model_options.emplace_back(kv.substr(0, eq), eq == std::string::npos ? "" : kv.substr(eq + 1));
  }
  j.schedule_file = absl::GetFlag(FLAGS_schedule_file);
  j.layers = Given(p, "layers", FLAGS_layers);
  j.seq = Given(p, "seq", FLAGS_seq);
  j.fp32 = Given(p, "fp32", FLAGS_fp32);
  j.attention = absl::GetFlag(FLAGS_attention);
  j.fused_layernorm = Given(p, "fused_layernorm", FLAGS_fused_layernorm);
  j.data = absl::GetFlag(FLAGS_data);
  j.lr = Given(p, "lr", FLAGS_lr);
  j.inference = Given(p, "inference", FLAGS_inference);
  j.save_params = Given(p, "save_params", FLAGS_save_params);
  j.timing = Given(p, "timing", FLAGS_timing);
  j.cuda_graphs = Given(p, "cuda_graphs", FLAGS_cuda_graphs);
  j.telemetry = Given(p, "telemetry", FLAGS_telemetry);
  j.health = absl::GetFlag(FLAGS_health);
  j.checkpoint_every = Given(p, "checkpoint_every", FLAGS_checkpoint_every);
  j.keep_checkpoints = Given(p, "keep_checkpoints", FLAGS_keep_checkpoints);
  j.resume = absl::GetFlag(FLAGS_resume);
  j.export_dir = absl::GetFlag(FLAGS_export_dir);
  j.init_from = absl::GetFlag(FLAGS_init_from);
  j.max_restarts = Given(p, "max_restarts", FLAGS_max_restarts);
  j.warmup_steps = Given(p, "warmup_steps", FLAGS_warmup_steps);
  j.lr_decay_steps = Given(p, "lr_decay_steps", FLAGS_lr_decay_steps);
  j.min_lr = Given(p, "min_lr", FLAGS_min_lr);
  j.weight_decay = Given(p, "weight_decay", FLAGS_weight_decay);
  j.grad_clip = Given(p, "grad_clip", FLAGS_grad_clip);
  j.init_on_device = Given(p, "init_on_device", FLAGS_init_on_device);
  j.prebuild_attention = Given(p, "prebuild_attention", FLAGS_prebuild_attention);
  j.profile_cache = Given(p, "profile_cache", FLAGS_profile_cache);
  j.profile_single_stage = Given(p, "profile_single_stage", FLAGS_profile_single_stage);
  j.partition_clocks = Given(p, "partition_clocks", FLAGS_partition_clocks);
  j.prefetch_libraries = Given(p, "prefetch_libraries", FLAGS_prefetch_libraries);
  j.data_parallel = Given(p, "data_parallel", FLAGS_data_parallel);
  j.shard_optimizer = Given(p, "shard_optimizer", FLAGS_shard_optimizer);
  j.layout = absl::GetFlag(FLAGS_layout);
  j.layout_profiles = absl::GetFlag(FLAGS_layout_profiles);
  j.bucket_mb = Given(p, "bucket_mb", FLAGS_bucket_mb);
  j.replica_gbps = Given(p, "replica_gbps", FLAGS_replica_gbps);
  j.val_fraction = Given(p, "val_fraction", FLAGS_val_fraction);
  j.eval_every = Given(p, "eval_every", FLAGS_eval_every);
  j.eval_batches = Given(p, "eval_batches", FLAGS_eval_batches);
  j.term_checkpoint_timeout_ms = Given(p, "term_checkpoint_timeout_ms", FLAGS_term_checkpoint_timeout_ms);
  return j;
}

std::vector<FlagGroup> HelpGroups(bool client) {
  std::vector<FlagGroup> groups;
  if (client) {
    groups.push_back({"The client (the server, your token, what a command shows)",
                      {"server", "token_file", "tls_ca", "tls_cert", "tls_key", "watch", "follow", "launcher",
                       "no_lines", "rank", "limit", "offset", "output", "role"}});
  }
  const std::vector<FlagGroup> job = {
      {"The job", {"job", "model", "device", "gpus", "workers", "steps", "seed", "sweep",
                   "tensor_elements", "worker_binary", "version"}},
      {"The model (model: every model that trains as a pipeline)",
       {"hidden", "layers", "heads", "kv_heads", "ffn_hidden", "vocab", "seq", "fp32", "model_option", "data",
        "val_fraction", "eval_every", "eval_batches", "inference"}},
      {"Pipeline and parallelism",
       {"pipeline_stages", "schedule", "schedule_file", "micro_batches", "global_batch", "stage_chunks", "partition",
        "partition_clocks", "layout", "layout_profiles", "profile_cache", "profile_single_stage", "data_parallel",
        "shard_optimizer", "bucket_mb", "replica_gbps"}},
      {"Training loop", {"lr", "warmup_steps", "lr_decay_steps", "min_lr", "weight_decay", "grad_clip"}},
      {"Checkpoints and weights",
       {"checkpoint_every", "keep_checkpoints", "resume", "max_restarts", "term_checkpoint_timeout_ms", "export_dir",
        "init_from", "save_params"}},
      {"Failure detection",
       {"heartbeat_timeout_ms", "progress_timeout_ms", "register_timeout_ms", "nccl_init_timeout_ms",
        "grace_period_ms"}},
      {"GPUs",
       {"attention", "fused_layernorm", "cuda_graphs", "init_on_device", "prebuild_attention", "health", "telemetry",
        "peak_tflops"}},
      {"Outputs and startup", {"run_dir", "overwrite", "timing", "prefetch_libraries"}},
  };
  groups.insert(groups.end(), job.begin(), job.end());
  if (!client) {
    groups.push_back({"Several hosts", {"nodes", "node_rank", "coordinator_address", "coordinator_port", "slurm",
                                        "job_token_file", "tls_cert", "tls_key", "tls_ca"}});
    groups.push_back({"Serve (a job server for `client`)",
                      {"serve", "state_dir", "listen", "job_roots", "new_admin_token", "tls_client_ca", "max_cpu_workers"}});
  }
  return groups;
}

}  // namespace stagehand
