// The pipeline engine (see pipeline.h). LibTorch translation unit; c10::Error becomes a Status at the
// public functions.
#include "worker/pipeline.h"

#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <optional>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "worker/gpt_job.h"
#include "worker/model.h"

namespace stagehand {
namespace {

GptConfig ToConfig(const GptSpec& g) {
  GptConfig c;
  c.vocab = g.vocab();
  c.hidden = g.hidden();
  c.heads = g.heads();
  c.layers = g.layers();
  c.seq = g.seq();
  c.bf16_autocast = !g.fp32();
  c.fused_layernorm = !g.unfused_layernorm();
  return c;
}

// The job's attention kernel, for this process's GPU work (CPU workers keep LibTorch's choice).
absl::Status SelectAttention(const JobSpec& job) {
  return job.device() == DEVICE_KIND_CUDA ? SelectAttentionKernel(job.gpt().attention()) : absl::OkStatus();
}

torch::Device DeviceOf(const JobSpec& job) {
  return job.device() == DEVICE_KIND_CUDA ? torch::Device(torch::kCUDA, 0) : torch::Device(torch::kCPU);
}

absl::StatusOr<std::unique_ptr<TokenSource>> MakeData(const JobSpec& job, const GptConfig& config) {
  if (job.data().empty() || job.data() == "synthetic") return MakeSyntheticCorpus(config, job.seed());
  return OpenTokenFile(job.data(), config, job.seed());
}

// Orders work between the compute stream and the communication stream on a GPU; no-ops on the CPU,
// where every transport call is complete when it returns.
// The one communication stream of this process: the NCCL transport is made with it (worker main),
// and the executor orders its compute against it.
at::cuda::CUDAStream CommStream() {
  static const at::cuda::CUDAStream stream = at::cuda::getStreamFromPool(/*isHighPriority=*/true, 0);
  return stream;
}

class Streams {
 public:
  explicit Streams(bool cuda) {
    if (!cuda) return;
    compute_.emplace(at::cuda::getStreamFromPool(/*isHighPriority=*/false, 0));
    comm_.emplace(CommStream());
  }
  bool cuda() const { return compute_.has_value(); }
  const at::cuda::CUDAStream& compute() const { return *compute_; }
  const at::cuda::CUDAStream& comm() const { return *comm_; }
  // The communication stream waits for what the compute stream has enqueued so far.
  void CommAfterCompute() {
    if (!cuda()) return;
    at::cuda::CUDAEvent e;
    e.record(*compute_);
    e.block(*comm_);
  }
  // An event on the communication stream, for the compute stream to wait on later.
  std::shared_ptr<at::cuda::CUDAEvent> MarkComm() {
    if (!cuda()) return nullptr;
    auto e = std::make_shared<at::cuda::CUDAEvent>();
    e->record(*comm_);
    return e;
  }
  void ComputeAfter(const std::shared_ptr<at::cuda::CUDAEvent>& e) {
    if (cuda() && e) e->block(*compute_);
  }
  // A tensor the communication stream reads must not be reused by the allocator before it is done.
  void KeepForComm(const torch::Tensor& t) {
    if (cuda()) c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), *comm_);
  }
  void Synchronize() {
    if (!cuda()) return;
    compute_->synchronize();
    comm_->synchronize();
  }

 private:
  std::optional<at::cuda::CUDAStream> compute_, comm_;
};

// Times a step's actions: CUDA events on the compute and communication streams on a GPU (read once
// the step has synchronised), the host clock on the CPU. Builds the rank's non-overlapping slices:
// each compute action, and before it the time its stream waited for a receive ("wait") or sat idle.
class StepTimer {
 public:
  StepTimer(bool enabled, Streams* streams) : enabled_(enabled), streams_(streams) {}

  void BeginStep() {
    if (!enabled_) return;
    entries_.clear();
    comm_.clear();
    host_start_ = Clock::now();
    start_unix_micros_ = absl::ToUnixMicros(absl::Now());
    if (streams_->cuda()) step_start_ = Record(streams_->compute());
  }
  // Brackets a compute action; `waited_for` names the receive its stream had to wait for, if any.
  void StartCompute() {
    if (!enabled_) return;
    pending_ = Mark(streams_->cuda() ? &streams_->compute() : nullptr);
  }
  void EndCompute(const Action& a, std::string waited_for) {
    if (!enabled_) return;
    entries_.push_back({ToString(a), Kind(a.type), pending_, Mark(streams_->cuda() ? &streams_->compute() : nullptr),
                        std::move(waited_for), 0});
  }
  // Brackets a send/receive group (on the communication stream on a GPU).
  void StartComm() {
    if (!enabled_) return;
    pending_ = Mark(streams_->cuda() ? &streams_->comm() : nullptr);
  }
  void EndComm(const std::vector<Action>& group, int64_t bytes) {
    if (!enabled_) return;
    std::string name;
    for (const Action& a : group) absl::StrAppend(&name, name.empty() ? "" : " ", ToString(a));
    const bool send = group[0].type == ActionType::kSendActivation || group[0].type == ActionType::kSendGradient;
    comm_.push_back({name, send ? "send" : "recv", pending_, Mark(streams_->cuda() ? &streams_->comm() : nullptr), "",
                     bytes});
  }
  // After the step's streams have synchronised.
  StepTiming Finish(int rank, int64_t step, double step_ms) const;

 private:
  using Clock = std::chrono::steady_clock;
  struct Mark_ {
    std::shared_ptr<at::cuda::CUDAEvent> event;
    Clock::time_point host;
  };
  struct Entry {
    std::string name, kind;
    Mark_ start, end;
    std::string waited_for;
    int64_t bytes;
  };
  static std::string Kind(ActionType t) {
    switch (t) {
      case ActionType::kForward: return "forward";
      case ActionType::kOptimizerStep: return "optimizer";
      default: return "backward";
    }
  }
  static std::shared_ptr<at::cuda::CUDAEvent> Record(const at::cuda::CUDAStream& stream) {
    auto e = std::make_shared<at::cuda::CUDAEvent>(cudaEventDefault);  // timing enabled
    e->record(stream);
    return e;
  }
  Mark_ Mark(const at::cuda::CUDAStream* stream) const {
    return {stream ? Record(*stream) : nullptr, Clock::now()};
  }
  double Ms(const Mark_& m) const {  // since the step's start
    if (m.event) return step_start_->elapsed_time(*m.event);
    return std::chrono::duration<double, std::milli>(m.host - host_start_).count();
  }

  const bool enabled_;
  Streams* streams_;
  Clock::time_point host_start_;
  int64_t start_unix_micros_ = 0;
  std::shared_ptr<at::cuda::CUDAEvent> step_start_;
  Mark_ pending_;
  std::vector<Entry> entries_, comm_;
};

StepTiming StepTimer::Finish(int rank, int64_t step, double step_ms) const {
  StepTiming t;
  t.set_rank(rank);
  t.set_step(step);
  t.set_step_ms(step_ms);
  t.set_start_unix_micros(start_unix_micros_);
  if (!enabled_) return t;
  auto add = [&](const std::string& name, const std::string& kind, double start, double end, int64_t bytes) {
    if (end - start <= 0) return;
    ActionTiming* a = t.add_actions();
    a->set_name(name);
    a->set_kind(kind);
    a->set_start_ms(start);
    a->set_duration_ms(end - start);
    a->set_bytes(bytes);
    if (kind == "forward") t.set_forward_ms(t.forward_ms() + end - start);
    if (kind == "backward") t.set_backward_ms(t.backward_ms() + end - start);
    if (kind == "optimizer") t.set_optimizer_ms(t.optimizer_ms() + end - start);
    if (kind == "wait" || kind == "send" || kind == "recv") t.set_wait_ms(t.wait_ms() + end - start);
  };
  // On the CPU communication blocks the one thread, so it is part of the rank's sequence of slices;
  // on a GPU it runs beside compute and shows only as the waits it causes.
  std::vector<const Entry*> track;
  for (const Entry& e : entries_) track.push_back(&e);
  if (!streams_->cuda()) {
    for (const Entry& e : comm_) track.push_back(&e);
    std::sort(track.begin(), track.end(), [](const Entry* a, const Entry* b) { return a->start.host < b->start.host; });
  }
  double prev = 0;
  for (const Entry* e : track) {
    const double start = std::max(prev, Ms(e->start)), end = std::max(start, Ms(e->end));
    add(e->waited_for.empty() ? "idle" : "wait " + e->waited_for, e->waited_for.empty() ? "idle" : "wait", prev, start, 0);
    add(e->name, e->kind, start, end, e->bytes);
    prev = end;
  }
  int64_t bytes = 0;
  double comm_ms = 0;
  for (const Entry& e : comm_) {
    bytes += e.bytes;
    comm_ms += std::max(0.0, Ms(e.end) - Ms(e.start));
  }
  t.set_comm_bytes(bytes);
  t.set_comm_ms(comm_ms);
  t.set_idle_ms(std::max(0.0, step_ms - t.forward_ms() - t.backward_ms() - t.optimizer_ms() - t.wait_ms()));
  return t;
}

// One micro-batch's forward and backward through the stage, captured as CUDA graphs and replayed for
// every micro-batch that the schedule puts in this slot. The graphs read and write only the slot's own
// tensors (and the parameters, their gradients and bf16 copies, all of fixed address), so replaying
// them is the captured work on new data: the host launches two graphs per micro-batch where it would
// launch hundreds of kernels (the launch cost bounds small micro-batches: at one sequence per
// micro-batch of gpt-1.3b the host, not the GPU, set the pace). Slots are as many as the micro-batches
// this rank holds at once (1F1B: at most the number of stages from this one to the last); each has its
// own memory pool.
struct GraphSlot {
  at::cuda::CUDAGraph forward, backward;
  torch::Tensor input;        // tokens [mb, S] (first stage) or hidden states [mb, S, H], a leaf
  torch::Tensor targets;      // the last stage's targets [mb, S] (training)
  torch::Tensor output;       // hidden states, or the micro-batch's loss (training) / logits (inference)
  torch::Tensor grad_output;  // the gradient received for `output` (training, not the last stage)
  torch::Tensor grad_input;   // input.grad after the backward (training, not the first stage)
};

// Captures one micro-batch's forward (and for training its backward) through `stage` on the current
// stream, in a memory pool of its own. The last stage's loss is divided by `loss_divisor` (the
// micro-batch count), as the executor does without graphs. The stage's parameters must have gradients
// already (they are accumulated into in place) and warmed-up kernels (a step run without graphs).
std::unique_ptr<GraphSlot> CaptureSlot(GptStage& stage, const torch::Device& device, int64_t mb, int64_t seq,
                                       int64_t hidden, bool inference, int loss_divisor) {
  const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device);
  const auto i64 = torch::TensorOptions().dtype(torch::kInt64).device(device);
  const bool loss = stage->has_head() && !inference;
  auto slot = std::make_unique<GraphSlot>();
  slot->input = stage->has_embedding() ? torch::zeros({mb, seq}, i64)
                                       : torch::zeros({mb, seq, hidden}, f32).requires_grad_(!inference);
  if (loss) slot->targets = torch::zeros({mb, seq}, i64);
  if (!stage->has_head() && !inference) slot->grad_output = torch::ones({mb, seq, hidden}, f32);
  const auto pool = at::cuda::graph_pool_handle();
  {
    std::optional<torch::NoGradGuard> no_grad;
    if (inference) no_grad.emplace();
    // Thread-local capture: other threads of this process (NCCL's, gRPC's) may use CUDA meanwhile.
    slot->forward.capture_begin(pool, cudaStreamCaptureModeThreadLocal);
    torch::Tensor out = stage->forward(slot->input);
    if (loss) out = LanguageModelLoss(out, slot->targets) / loss_divisor;
    slot->forward.capture_end();
    slot->output = out;
  }
  if (!inference) {
    // The autograd engine's device thread launches the backward onto the capturing stream.
    slot->backward.capture_begin(pool, cudaStreamCaptureModeThreadLocal);
    if (loss) {
      torch::autograd::backward({slot->output}, {}, /*retain_graph=*/true);
    } else {
      torch::autograd::backward({slot->output}, {slot->grad_output}, /*retain_graph=*/true);
    }
    slot->backward.capture_end();
    if (!stage->has_embedding()) slot->grad_input = slot->input.grad();
  }
  return slot;
}

class Executor {
 public:
  Executor(const Assignment& a, Transport* transport, GptStage stage, std::unique_ptr<TokenSource> data,
           Streams* streams)
      : a_(a), job_(a.job()), transport_(transport), stage_(std::move(stage)), data_(std::move(data)),
        streams_(streams), device_(DeviceOf(job_)), m_(job_.pipeline().micro_batches()),
        mb_(MicroBatchSize(job_)), inference_(job_.pipeline().inference()), timer_(!job_.no_timing(), streams) {
    const auto f32 = torch::TensorOptions().dtype(torch::kFloat32).device(device_);
    const int64_t s = job_.gpt().seq(), h = job_.gpt().hidden();
    // Receive buffers, allocated once and reused by every step.
    if (!stage_->has_embedding()) {
      for (int i = 0; i < m_; ++i) act_in_.push_back(torch::empty({mb_, s, h}, f32));
    }
    if (!stage_->has_head() && !inference_) {
      for (int i = 0; i < m_; ++i) grad_in_.push_back(torch::empty({mb_, s, h}, f32));
    }
    inputs_.resize(m_);
    outputs_.resize(m_);
    grad_out_.resize(m_);
    act_ready_.resize(m_);
    grad_ready_.resize(m_);
    if (!inference_) {
      optimizer_ = std::make_unique<FusedAdamW>(stage_->parameters(), job_.lr() > 0 ? job_.lr() : 1e-4);
    }
    // Graphs for 1F1B and inference, whose in-flight micro-batches are few; GPipe holds all of them.
    graphs_ = device_.is_cuda() && !job_.no_cuda_graphs() && (inference_ || job_.pipeline().schedule() == "1f1b");
    if (graphs_) {
      // What the graphs hand over leaves their slot at once: the slot's next replay overwrites it.
      if (!stage_->has_head()) {
        for (int i = 0; i < m_; ++i) act_out_.push_back(torch::empty({mb_, s, h}, f32));
      }
      if (!stage_->has_embedding() && !inference_) {
        for (int i = 0; i < m_; ++i) grad_out_buffers_.push_back(torch::empty({mb_, s, h}, f32));
      }
    }
  }

  absl::StatusOr<StepResult> Step(int64_t step, const Schedule& schedule);

 private:
  absl::Status Run(const std::vector<Action>& actions, size_t& i);
  absl::Status Communicate(const std::vector<Action>& group);
  void Forward(int mb);
  void Backward(int mb);
  void Capture(const std::vector<Action>& actions);
  void ReplayForward(int mb);
  void ReplayBackward(int mb);
  torch::Tensor Tokens(int mb, bool targets);
  void LoadBatch();

  const Assignment& a_;
  const JobSpec& job_;
  Transport* transport_;
  GptStage stage_;
  std::unique_ptr<TokenSource> data_;
  Streams* streams_;
  const torch::Device device_;
  const int m_;
  const int64_t mb_;
  const bool inference_;
  int64_t step_ = 0;
  std::unique_ptr<FusedAdamW> optimizer_;
  std::vector<torch::Tensor> act_in_, grad_in_;          // receive buffers
  std::vector<torch::Tensor> inputs_, outputs_, grad_out_;  // per micro-batch, within a step
  std::vector<std::shared_ptr<at::cuda::CUDAEvent>> act_ready_, grad_ready_;
  torch::Tensor loss_sum_;
  torch::Tensor batch_;  // the current step's global batch of tokens, on the device
  StepTimer timer_;
  bool graphs_ = false;    // CUDA graphs wanted; captured at the start of step 1 (step 0 warms up)
  bool captured_ = false;
  std::vector<std::unique_ptr<GraphSlot>> slots_;
  std::vector<int> slot_of_;                          // micro-batch -> slot
  std::vector<torch::Tensor> act_out_, grad_out_buffers_;  // graphs' outputs, per micro-batch
};

// Micro-batch mb of the step's global batch: the same sequences however the batch is split, so that
// runs with different micro-batch counts (and a single process) see the same data.
torch::Tensor Executor::Tokens(int mb, bool targets) {
  torch::Tensor rows = batch_.slice(0, mb * mb_, (mb + 1) * mb_);
  return (targets ? rows.slice(1, 1) : rows.slice(1, 0, -1)).contiguous();
}

// The step's tokens go to the device in one asynchronous copy at the start of the step: a copy per
// micro-batch from pageable memory would stall the host until the GPU drained, every micro-batch.
void Executor::LoadBatch() {
  if (!stage_->has_embedding() && !stage_->has_head()) return;
  torch::Tensor batch = data_->Batch(step_, 0, job_.pipeline().global_batch());
  batch_ = device_.is_cuda() ? batch.pin_memory().to(device_, /*non_blocking=*/true) : batch;
}

void Executor::Forward(int mb) {
  if (captured_) return ReplayForward(mb);
  torch::Tensor input;
  if (stage_->has_embedding()) {
    input = Tokens(mb, false);
  } else {
    input = act_in_[mb].detach();
    if (!inference_) input.requires_grad_(true);
  }
  std::optional<torch::NoGradGuard> no_grad;
  if (inference_) no_grad.emplace();
  torch::Tensor out = stage_->forward(input);
  if (stage_->has_head() && !inference_) {
    torch::Tensor loss = LanguageModelLoss(out, Tokens(mb, true)) / m_;
    loss_sum_ = loss_sum_.defined() ? loss_sum_ + loss.detach() : loss.detach();
    out = loss;
  }
  inputs_[mb] = input;
  outputs_[mb] = out;
}

void Executor::Backward(int mb) {
  if (captured_) return ReplayBackward(mb);
  if (stage_->has_head()) {
    outputs_[mb].backward();
  } else {
    torch::autograd::backward({outputs_[mb]}, {grad_in_[mb]});
  }
  if (!stage_->has_embedding()) grad_out_[mb] = inputs_[mb].grad();
  inputs_[mb] = torch::Tensor();
  outputs_[mb] = torch::Tensor();
}

// Assigns micro-batches to slots (AssignSlots: in inference the forward's output is copied out, so a
// slot is free again at once) and captures each slot's forward and backward on the compute stream.
void Executor::Capture(const std::vector<Action>& actions) {
  const SlotPlan plan = AssignSlots(actions, m_, /*release_after_forward=*/inference_);
  slot_of_ = plan.slot_of;
  for (int k = 0; k < plan.slots; ++k) {
    slots_.push_back(CaptureSlot(stage_, device_, mb_, job_.gpt().seq(), job_.gpt().hidden(), inference_, m_));
  }
}

void Executor::ReplayForward(int mb) {
  GraphSlot& g = *slots_[slot_of_[mb]];
  {
    torch::NoGradGuard no_grad;  // the slot's input is a leaf that requires grad
    if (stage_->has_embedding()) {
      g.input.copy_(Tokens(mb, false));
    } else {
      g.input.copy_(act_in_[mb]);
    }
    if (g.targets.defined()) g.targets.copy_(Tokens(mb, true));
  }
  g.forward.replay();
  if (!stage_->has_head()) {
    act_out_[mb].copy_(g.output.detach());
    outputs_[mb] = act_out_[mb];
  } else if (!inference_) {
    torch::Tensor loss = g.output.detach();
    loss_sum_ = loss_sum_.defined() ? loss_sum_ + loss : loss.clone();
  }
}

void Executor::ReplayBackward(int mb) {
  GraphSlot& g = *slots_[slot_of_[mb]];
  if (g.grad_output.defined()) g.grad_output.copy_(grad_in_[mb]);
  g.backward.replay();
  if (g.grad_input.defined()) {
    grad_out_buffers_[mb].copy_(g.grad_input);
    grad_out_[mb] = grad_out_buffers_[mb];
  }
}

// Posts a send/receive group (or a single operation) on the communication stream.
absl::Status Executor::Communicate(const std::vector<Action>& group) {
  std::vector<Transport::P2POp> ops;
  bool any_send = false;
  for (const Action& x : group) any_send |= x.type == ActionType::kSendActivation || x.type == ActionType::kSendGradient;
  if (any_send) streams_->CommAfterCompute();
  for (const Action& x : group) {
    torch::Tensor t;
    bool send = false;
    switch (x.type) {
      case ActionType::kSendActivation: t = outputs_[x.microbatch].detach(); send = true; break;
      case ActionType::kSendGradient: t = grad_out_[x.microbatch]; send = true; break;
      case ActionType::kRecvActivation: t = act_in_[x.microbatch]; break;
      case ActionType::kRecvGradient: t = grad_in_[x.microbatch]; break;
      default: return absl::InternalError(absl::StrCat("not a communication action: ", ToString(x)));
    }
    if (!t.defined() || !t.is_contiguous() || t.scalar_type() != torch::kFloat32) {
      return absl::InternalError(absl::StrCat(ToString(x), ": no contiguous float32 tensor to move"));
    }
    if (send) streams_->KeepForComm(t);
    ops.push_back({send, t.data_ptr(), static_cast<int64_t>(t.nbytes()), x.peer});
  }
  if (transport_ == nullptr) return absl::InternalError("a multi-stage schedule without a transport");
  int64_t bytes = 0;
  for (const Transport::P2POp& op : ops) bytes += op.bytes;
  timer_.StartComm();
  absl::Status s = ops.size() == 1 ? (ops[0].send ? transport_->Send(ops[0].data, ops[0].bytes, ops[0].peer)
                                                  : transport_->Recv(ops[0].data, ops[0].bytes, ops[0].peer))
                                   : transport_->Group(ops);
  if (!s.ok()) return s;
  timer_.EndComm(group, bytes);
  auto done = streams_->MarkComm();
  for (const Action& x : group) {
    if (x.type == ActionType::kRecvActivation) act_ready_[x.microbatch] = done;
    if (x.type == ActionType::kRecvGradient) grad_ready_[x.microbatch] = done;
    if (x.type == ActionType::kSendGradient) grad_out_[x.microbatch] = torch::Tensor();
  }
  return absl::OkStatus();
}

bool IsComm(ActionType t) {
  return t == ActionType::kSendActivation || t == ActionType::kRecvActivation || t == ActionType::kSendGradient ||
         t == ActionType::kRecvGradient;
}

// Runs actions[i] (and the rest of its group), advancing i past them.
absl::Status Executor::Run(const std::vector<Action>& actions, size_t& i) {
  const Action& x = actions[i];
  if (IsComm(x.type)) {
    std::vector<Action> group{x};
    while (x.group >= 0 && i + 1 < actions.size() && actions[i + 1].group == x.group) group.push_back(actions[++i]);
    ++i;
    return Communicate(group);
  }
  ++i;
  // The compute stream waits for the receive this action needs, before its timing starts: the wait
  // shows as its own slice.
  std::string waited_for;
  if (x.type == ActionType::kForward && !stage_->has_embedding()) {
    streams_->ComputeAfter(act_ready_[x.microbatch]);
    waited_for = absl::StrCat("RA", x.microbatch);
  } else if (x.type == ActionType::kBackward && !stage_->has_head()) {
    streams_->ComputeAfter(grad_ready_[x.microbatch]);
    waited_for = absl::StrCat("RG", x.microbatch);
  }
  timer_.StartCompute();
  switch (x.type) {
    case ActionType::kForward: Forward(x.microbatch); break;
    case ActionType::kBackward: Backward(x.microbatch); break;
    case ActionType::kOptimizerStep:
      optimizer_->Step();
      optimizer_->ZeroGrad(/*set_to_none=*/!graphs_);  // captured graphs accumulate into fixed gradients
      break;
    default:
      return absl::UnimplementedError(absl::StrCat("the executor does not run ", ToString(x), " yet"));
  }
  timer_.EndCompute(x, std::move(waited_for));
  return absl::OkStatus();
}

absl::StatusOr<StepResult> Executor::Step(int64_t step, const Schedule& schedule) {
  const auto t0 = std::chrono::steady_clock::now();
  step_ = step;
  loss_sum_ = torch::Tensor();
  std::optional<c10::cuda::CUDAStreamGuard> guard;  // every kernel of the step on the compute stream
  if (streams_->cuda()) guard.emplace(streams_->compute());
  timer_.BeginStep();
  LoadBatch();
  const std::vector<Action>& actions = schedule.ranks[a_.rank()];
  if (graphs_) {
    stage_->RefreshCasts();  // the optimizer's update, into the bf16 copies the graphs read
    if (!captured_ && step >= 1) {
      try {
        Capture(actions);
      } catch (const c10::Error& e) {
        return absl::InternalError(absl::StrCat("capturing the stage's CUDA graphs: ", e.what_without_backtrace(),
                                                "; --cuda_graphs=false runs it without them"));
      }
      captured_ = true;
    }
  }
  streams_->CommAfterCompute();  // receive buffers are free once the previous step's compute is done
  for (size_t i = 0; i < actions.size();) {
    if (absl::Status s = Run(actions, i); !s.ok()) return s;
  }
  StepResult r;
  r.step = step;
  if (stage_->has_head() && loss_sum_.defined()) {
    r.has_loss = true;
    r.loss = loss_sum_.item<double>();
  }
  streams_->Synchronize();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.timing = timer_.Finish(a_.rank(), step, r.seconds * 1e3);
  r.tokens = job_.pipeline().global_batch() * job_.gpt().seq();
  if (device_.is_cuda()) {
    const auto aggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    r.peak_memory_bytes = c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[aggregate].peak;
  }
  return r;
}

absl::Status SaveParams(const GptStage& stage, const JobSpec& job, int rank) {
  std::vector<torch::Tensor> params;
  for (const auto& p : stage->parameters()) params.push_back(p.detach().cpu());
  torch::save(params, absl::StrCat(job.run_dir(), "/params_rank", rank, ".pt"));
  return absl::OkStatus();
}

absl::Status RunPipelineImpl(const Assignment& a, Transport* transport, const PipelineStepCallback& on_step) {
  const JobSpec& job = a.job();
  const GptConfig config = ToConfig(job.gpt());
  if (absl::Status s = SelectAttention(job); !s.ok()) return s;
  const std::string name = job.pipeline().inference() ? "forward" : job.pipeline().schedule();
  absl::StatusOr<Schedule> schedule = MakeSchedule(name, a.num_stages(), job.pipeline().micro_batches());
  if (!schedule.ok()) return schedule.status();
  absl::StatusOr<std::unique_ptr<TokenSource>> data = MakeData(job, config);
  if (!data.ok()) return data.status();
  Streams streams(job.device() == DEVICE_KIND_CUDA);
  GptStage stage(config, a.first_layer(), a.last_layer(), job.seed());
  stage->to(DeviceOf(job));
  if (job.pipeline().inference()) stage->eval();
  Executor executor(a, transport, stage, *std::move(data), &streams);
  for (int64_t step = 0; step < job.steps(); ++step) {
    absl::StatusOr<StepResult> r = executor.Step(step, *schedule);
    if (!r.ok()) return r.status();
    if (absl::Status s = on_step(*r); !s.ok()) return s;
  }
  if (job.save_params()) return SaveParams(stage, job, a.rank());
  return absl::OkStatus();
}

// Times fn (forward, or forward and backward) on the device: a warm-up, then the mean of `reps`.
double TimeMs(const std::function<void()>& fn, bool cuda, int reps = 3) {
  fn();
  if (cuda) torch::cuda::synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) fn();
  if (cuda) torch::cuda::synchronize();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() / reps;
}

int64_t Allocated(bool cuda) {
  if (!cuda) return 0;
  const auto aggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  return c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[aggregate].current;
}

// One layer's costs: forward time, forward+backward time minus forward, memory kept by autograd.
LayerCost ProfileLayer(const JobSpec& job, const GptConfig& config, int layer) {
  const bool cuda = job.device() == DEVICE_KIND_CUDA;
  const torch::Device device = DeviceOf(job);
  const int64_t mb = MicroBatchSize(job);
  GptStage stage(config, layer, layer + 1, job.seed());
  stage->to(device);
  torch::Tensor input = layer == 0 ? torch::randint(config.vocab, {mb, config.seq}, torch::TensorOptions().dtype(torch::kInt64).device(device))
                                   : torch::randn({mb, config.seq, config.hidden}, torch::TensorOptions().device(device)).requires_grad_(true);
  const bool head = GptLayerKindOf(layer, config.layers) == GptLayerKind::kHead;
  torch::Tensor targets = torch::randint(config.vocab, {mb, config.seq}, torch::TensorOptions().dtype(torch::kInt64).device(device));
  auto forward = [&] { return head ? LanguageModelLoss(stage->forward(input), targets) : stage->forward(input); };
  auto both = [&] {
    torch::Tensor out = forward();
    if (head) out.backward(); else out.backward(torch::ones_like(out));
  };
  LayerCost cost;
  if (cuda) {
    // What the executor runs: the layer's captured graphs, timed by events on the stream. (Timing eager
    // calls by the host clock counted milliseconds of host overhead into some layers' backward.)
    both();  // warm-up, and the gradients the graphs accumulate into
    {
      torch::NoGradGuard no_grad;
      for (auto& p : stage->parameters()) p.mutable_grad().zero_();
    }
    std::unique_ptr<GraphSlot> slot = CaptureSlot(stage, device, mb, config.seq, config.hidden, /*inference=*/false, 1);
    {
      torch::NoGradGuard no_grad;
      slot->input.copy_(input);
      if (slot->targets.defined()) slot->targets.copy_(targets);
    }
    auto replay_ms = [&](bool backward) {
      const at::cuda::CUDAStream stream = at::cuda::getCurrentCUDAStream();
      auto once = [&] {
        slot->forward.replay();
        if (backward) slot->backward.replay();
      };
      once();
      at::cuda::CUDAEvent start(cudaEventDefault), end(cudaEventDefault);
      start.record(stream);
      constexpr int kReps = 5;
      for (int i = 0; i < kReps; ++i) once();
      end.record(stream);
      end.synchronize();
      return static_cast<double>(start.elapsed_time(end)) / kReps;
    };
    const double fwd = replay_ms(false);
    cost.set_forward_ms(fwd);
    cost.set_backward_ms(std::max(0.0, replay_ms(true) - fwd));
  } else {
    double fwd = TimeMs([&] { torch::NoGradGuard g; forward(); }, cuda);
    cost.set_forward_ms(fwd);
    cost.set_backward_ms(std::max(0.0, TimeMs(both, cuda) - fwd));
  }
  int64_t params = 0;
  for (const auto& p : stage->parameters()) params += p.numel();
  cost.set_param_bytes(params * 16);  // fp32 parameter, gradient, two AdamW moments
  const int64_t before = Allocated(cuda);
  torch::Tensor kept = forward();
  cost.set_activation_bytes(std::max<int64_t>(0, Allocated(cuda) - before));
  return cost;
}

absl::StatusOr<LayerProfile> ProfileModelImpl(const JobSpec& job) {
  const GptConfig config = ToConfig(job.gpt());
  if (absl::Status s = SelectAttention(job); !s.ok()) return s;
  std::optional<c10::cuda::CUDAStreamGuard> guard;
  if (job.device() == DEVICE_KIND_CUDA) guard.emplace(at::cuda::getStreamFromPool(false, 0));
  // Layers of one kind have the same shapes: the first of each kind is measured, once.
  std::optional<LayerCost> costs[kGptLayerKinds];
  LayerProfile profile;
  profile.set_micro_batch(MicroBatchSize(job));
  for (int i = 0; i < config.pipeline_layers(); ++i) {
    std::optional<LayerCost>& cost = costs[static_cast<int>(GptLayerKindOf(i, config.layers))];
    if (!cost) cost = ProfileLayer(job, config, i);
    *profile.add_layers() = *cost;
  }
  return profile;
}

}  // namespace

void* PipelineCommStream() { return CommStream().stream(); }

absl::StatusOr<LayerProfile> ProfileModel(const JobSpec& job) {
  try {
    return ProfileModelImpl(job);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("profiling the model: ", e.what_without_backtrace()));
  }
}

absl::Status RunPipeline(const Assignment& a, Transport* transport, const PipelineStepCallback& on_step) {
  try {
    return RunPipelineImpl(a, transport, on_step);
  } catch (const c10::Error& e) {
    return absl::InternalError(absl::StrCat("LibTorch: ", e.what_without_backtrace()));
  }
}

}  // namespace stagehand
