// The pipeline engine (see executor.h). LibTorch translation unit: c10::Error from a stage becomes a
// Status naming the action at Step().
#include "engine/executor.h"

#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>

#include "absl/strings/str_cat.h"

namespace stagehand {
namespace {

// For messages: what an action kind does.
const char* ActionKindName(ActionKind k) {
  switch (k) {
    case ActionKind::kForward:
      return "forward";
    case ActionKind::kBackward:
      return "backward";
    case ActionKind::kBackwardInput:
      return "input-gradient";
    case ActionKind::kBackwardWeight:
      return "weight-gradient";
    case ActionKind::kSendForward:
      return "send activation";
    case ActionKind::kRecvForward:
      return "receive activation";
    case ActionKind::kSendBackward:
      return "send gradient";
    case ActionKind::kRecvBackward:
      return "receive gradient";
    case ActionKind::kOptimizerStep:
      return "optimizer step";
  }
  return "unknown";
}

bool IsSend(ActionKind k) { return k == ActionKind::kSendForward || k == ActionKind::kSendBackward; }

// A list with the zero-bubble split (I and W) holds activations from I to W: no captured graphs.
bool SplitsBackward(const std::vector<Action>& actions) {
  return std::any_of(actions.begin(), actions.end(), [](const Action& a) {
    return a.kind == ActionKind::kBackwardInput || a.kind == ActionKind::kBackwardWeight;
  });
}

torch::Tensor Empty(const TensorSpec& spec, const torch::Device& device) {
  return torch::empty(spec.sizes, torch::TensorOptions().dtype(spec.dtype).device(device));
}

// Per chunk, the index of the action after which its gradients of the step are complete and sent on:
// its last backward (or weight-gradient) action and the communication right after it; -1 for a chunk
// the list never runs backward.
std::vector<int> LastGradientActions(const std::vector<Action>& actions, size_t chunks) {
  std::vector<int> last(chunks, -1);
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    const bool gradient = a.kind == ActionKind::kBackward || a.kind == ActionKind::kBackwardWeight;
    if (gradient && a.chunk >= 0 && a.chunk < static_cast<int>(chunks)) last[a.chunk] = static_cast<int>(i);
  }
  for (int& l : last) {
    while (l >= 0 && l + 1 < static_cast<int>(actions.size()) && IsCommunication(actions[l + 1].kind)) ++l;
  }
  return last;
}

}  // namespace

// What one (chunk, micro-batch) holds within a step.
struct Executor::Slot {
  torch::Tensor input, output;    // the forward's input (a leaf when training) and output (or loss)
  torch::Tensor grad_out;         // the gradient w.r.t. input, to send upstream
  torch::Tensor grad_for_weight;  // zero-bubble split: the output's gradient, kept from I for W
  torch::Tensor act_in, grad_in;  // receive buffers, allocated once
  std::shared_ptr<at::cuda::CUDAEvent> act_ready, grad_ready;  // when their receive is done
  torch::Tensor act_out, grad_out_buffer;                      // with graphs: copies of what a slot's replay produced
};

std::unique_ptr<GraphSlot> CaptureSlot(Stage& stage, int64_t batch, int64_t seq, bool first, bool last, bool inference,
                                       int loss_divisor, const torch::Device& device) {
  const bool loss = last && !inference;
  auto slot = std::make_unique<GraphSlot>();
  slot->input = Empty(stage.Input(batch), device).zero_();
  if (!first && !inference) slot->input.requires_grad_(true);
  if (loss) slot->targets = torch::zeros({batch, seq}, torch::TensorOptions().dtype(torch::kInt64).device(device));
  if (!last && !inference) slot->grad_output = Empty(stage.Output(batch), device).fill_(1);
  const auto pool = at::cuda::graph_pool_handle();
  {
    std::optional<torch::NoGradGuard> no_grad;
    if (inference) no_grad.emplace();
    // Thread-local capture: other threads of this process (NCCL's, gRPC's) may use CUDA meanwhile.
    slot->forward.capture_begin(pool, cudaStreamCaptureModeThreadLocal);
    torch::Tensor out = stage.Forward(slot->input);
    if (loss) out = stage.Loss(out, slot->targets) / loss_divisor;
    slot->forward.capture_end();
    slot->output = out;
  }
  if (!inference) {
    // The autograd engine's device thread launches the backward onto the capturing stream.
    slot->backward.capture_begin(pool, cudaStreamCaptureModeThreadLocal);
    torch::autograd::backward(
        {slot->output}, loss ? torch::autograd::variable_list{} : torch::autograd::variable_list{slot->grad_output},
        /*retain_graph=*/true);
    slot->backward.capture_end();
    if (!first) slot->grad_input = slot->input.grad();
  }
  return slot;
}

Executor::Executor(ExecutorOptions options, std::vector<std::unique_ptr<Stage>> chunks, const TokenSource* data,
                   Transport* transport, Streams* streams)
    : o_(std::move(options)),
      actions_(o_.schedule.ranks[o_.rank]),
      eval_actions_(ForwardPart(o_.schedule).ranks[o_.rank]),
      running_(&actions_),
      chunks_(std::move(chunks)),
      data_(data),
      transport_(transport),
      streams_(streams),
      m_(o_.schedule.num_microbatches),
      training_(!o_.schedule.forward_only),
      timer_(o_.timing, streams) {
  for (int s = 0; s < o_.schedule.num_stages; ++s) {
    if (o_.schedule.stage_rank[s] == o_.rank) chunk_stage_.push_back(s);
  }
  slots_.resize(static_cast<size_t>(chunks_.size()) * m_);
  last_backward_ = LastGradientActions(actions_, chunks_.size());
  // Peak memory from here on: the profile that ran before (and its graphs) is not the run's.
  if (o_.device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(0);
  if (training_) {
    optimizer_ =
        std::make_unique<FusedAdamW>(Parameters(), o_.lr, 0.9, 0.95, 1e-8, o_.weight_decay, o_.fused_optimizer);
    for (auto& c : chunks_) c->SetTraining(true);
  } else {
    for (auto& c : chunks_) c->SetTraining(false);
  }
  // Graphs where the list keeps fewer micro-batches in flight than it has (1F1B; inference copies each
  // output out at once): a list that holds them all (GPipe) would need a memory pool per micro-batch.
  if (o_.device.is_cuda() && o_.cuda_graphs && chunks_.size() == 1 && !SplitsBackward(actions_)) {
    const SlotPlan plan = AssignSlots(actions_, m_, /*release_after_forward=*/!training_);
    graphs_ = !training_ || plan.slots < m_;
  }
}

Executor::~Executor() = default;

std::vector<torch::Tensor> Executor::Parameters(int chunk) const { return chunks_[chunk]->Parameters(); }

std::vector<torch::Tensor> Executor::Parameters() const {
  std::vector<torch::Tensor> out;
  for (const auto& c : chunks_) {
    for (torch::Tensor& p : c->Parameters()) out.push_back(p);
  }
  return out;
}

std::vector<std::pair<std::string, torch::Tensor>> Executor::NamedParameters() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& c : chunks_) {
    std::map<const void*, std::string> names;
    for (auto& [name, p] : c->NamedParameters()) names[p.unsafeGetTensorImpl()] = name;
    for (torch::Tensor& p : c->Parameters()) out.emplace_back(names[p.unsafeGetTensorImpl()], p);
  }
  return out;
}

std::vector<std::vector<torch::Tensor>> Executor::ChunkParameters() const {
  std::vector<std::vector<torch::Tensor>> out;
  for (const auto& c : chunks_) out.push_back(c->Parameters());
  return out;
}

bool Executor::First(int chunk) const { return chunk_stage_[chunk] == 0; }
bool Executor::Last(int chunk) const { return chunk_stage_[chunk] == o_.schedule.num_stages - 1; }
Executor::Slot& Executor::At(int chunk, int mb) { return slots_[static_cast<size_t>(chunk) * m_ + mb]; }

absl::Status Executor::Check() const {
  if (chunk_stage_.size() != chunks_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", o_.rank, " holds ", chunk_stage_.size(),
                                                   " stages of the schedule but was given ", chunks_.size()));
  }
  for (const Action& a : actions_) {
    const std::string name = ToString(a);
    switch (a.kind) {
      case ActionKind::kForward:
      case ActionKind::kSendForward:
      case ActionKind::kRecvForward:
        break;
      case ActionKind::kBackward:
      case ActionKind::kBackwardInput:
      case ActionKind::kBackwardWeight:
      case ActionKind::kSendBackward:
      case ActionKind::kRecvBackward:
      case ActionKind::kOptimizerStep:
        if (!training_) {
          return absl::InvalidArgumentError(
              absl::StrCat("rank ", o_.rank, ": ", name, " in a forward-only (inference) list"));
        }
        break;
      default:
        return absl::InvalidArgumentError(absl::StrCat("rank ", o_.rank, ": the executor does not run ", name, " (",
                                                       ActionKindName(a.kind), ") actions"));
    }
    if (a.kind == ActionKind::kOptimizerStep) continue;
    if (a.chunk < 0 || a.chunk >= static_cast<int>(chunks_.size()) || chunk_stage_[a.chunk] != a.stage ||
        a.microbatch < 0 || a.microbatch >= m_) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", o_.rank, ": ", name, " names chunk ", a.chunk,
                                                     " and micro-batch ", a.microbatch,
                                                     ", which this rank does "
                                                     "not hold (",
                                                     chunks_.size(), " chunks, ", m_, " micro-batches)"));
    }
    if (IsCommunication(a.kind) && transport_ == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", o_.rank, ": ", name, " without a transport"));
    }
  }
  return absl::OkStatus();
}

// Micro-batch mb of the step's global batch: the same sequences however the batch is split, so that
// runs with different micro-batch counts (and a single process) see the same data.
torch::Tensor Executor::Tokens(int mb, bool targets) {
  torch::Tensor rows = batch_.slice(0, mb * o_.micro_batch, (mb + 1) * o_.micro_batch);
  return (targets ? rows.slice(1, 1) : rows.slice(1, 0, -1)).contiguous();
}

// The step's tokens go to the device in one asynchronous copy at the start of the step: a copy per
// micro-batch from pageable memory would stall the host until the GPU drained, every micro-batch. The
// copy was usually queued at the end of the step before (PrefetchBatch), and is taken here.
void Executor::LoadBatch(const TokenSource& from, int64_t step, int64_t index, bool targets) {
  bool needs = false;
  for (size_t c = 0; c < chunks_.size(); ++c) needs |= First(c) || (Last(c) && targets);
  if (!needs) return;
  if (next_batch_.defined() && next_from_ == &from && next_step_ == step && next_index_ == index) {
    batch_ = std::move(next_batch_);
    next_batch_ = torch::Tensor();
    next_from_ = nullptr;
  } else {
    batch_ = FetchBatch(from, step, index);  // an evaluation's batch leaves the training step's prefetch be
  }
}

torch::Tensor Executor::FetchBatch(const TokenSource& from, int64_t step, int64_t index) const {
  const int64_t rows = m_ * o_.micro_batch;
  torch::Tensor batch = from.Batch(step, index, rows * o_.replicas);
  if (o_.replicas > 1) batch = batch.slice(0, o_.replica * rows, (o_.replica + 1) * rows).contiguous();
  return o_.device.is_cuda() ? batch.pin_memory().to(o_.device, /*non_blocking=*/true) : batch;
}

// Makes the tokens of (from, step, index) on the host and queues their copy behind the kernels already
// queued, so that the next step starts its kernels without the host's data work first (about 3 ms of
// an idle GPU per gpt-1.3b step on an H200). Batch() depends on its arguments alone, so a prefetched
// batch is the one LoadBatch would make; one that is not asked for next is dropped. (On CPU workers it
// gains nothing and runs all the same, so that the CPU tests cover the path.)
void Executor::PrefetchBatch(const TokenSource& from, int64_t step, int64_t index) {
  bool needs = false;
  for (size_t c = 0; c < chunks_.size(); ++c) needs |= First(c) || Last(c);
  if (!needs) return;
  next_batch_ = FetchBatch(from, step, index);
  next_from_ = &from;
  next_step_ = step;
  next_index_ = index;
}

// The neighbour stages' chunks on this rank, if they are here (-1 otherwise).
namespace {
int LocalChunk(const std::vector<int>& chunk_stage, int stage) {
  auto it = std::find(chunk_stage.begin(), chunk_stage.end(), stage);
  return it == chunk_stage.end() ? -1 : static_cast<int>(it - chunk_stage.begin());
}
}  // namespace

void Executor::Forward(const Action& a) {
  Slot& s = At(a.chunk, a.microbatch);
  Stage& stage = *chunks_[a.chunk];
  const bool first = First(a.chunk), last = Last(a.chunk);
  // The loss: training, evaluation, and inference of a model with weights (o_.inference_loss).
  const bool grad = training_ && !evaluating_, loss = last && (training_ || evaluating_ || o_.inference_loss);
  if (captured_ && !evaluating_) {
    GraphSlot& g = *graph_slots_[graph_slot_of_[a.microbatch]];
    {
      torch::NoGradGuard no_grad;  // the slot's input is a leaf that requires grad
      g.input.copy_(first ? Tokens(a.microbatch, false) : s.act_in);
      if (g.targets.defined()) g.targets.copy_(Tokens(a.microbatch, true));
    }
    g.forward.replay();
    if (!last) {
      if (!s.act_out.defined()) s.act_out = torch::empty_like(g.output);
      s.act_out.copy_(g.output.detach());  // the slot's next replay overwrites its output
      s.output = s.act_out;
    } else if (training_) {
      torch::Tensor l = g.output.detach();
      loss_sum_ = loss_sum_.defined() ? loss_sum_ + l : l.clone();
    } else if (o_.inference_loss) {
      torch::NoGradGuard no_grad;
      AddInferenceLoss(stage, g.output, a.microbatch);
    }
    return;
  }
  torch::Tensor input;
  if (first) {
    input = Tokens(a.microbatch, false);
  } else {
    const int prev = LocalChunk(chunk_stage_, a.stage - 1);
    input = (prev >= 0 ? At(prev, a.microbatch).output : s.act_in).detach();
    if (grad) input.requires_grad_(true);
  }
  std::optional<torch::NoGradGuard> no_grad;
  if (!grad) no_grad.emplace();
  torch::Tensor out = stage.Forward(input);
  if (loss) {
    torch::Tensor l = stage.Loss(out, Tokens(a.microbatch, true)) / m_;
    loss_sum_ = loss_sum_.defined() ? loss_sum_ + l.detach() : l.detach();
    out = l;
  }
  s.input = evaluating_ ? torch::Tensor() : input;
  s.output = last && !grad ? torch::Tensor() : out;  // inference and evaluation: the logits are not kept
}

void Executor::AddInferenceLoss(Stage& stage, const torch::Tensor& logits, int mb) {
  torch::Tensor loss = stage.Loss(logits, Tokens(mb, true)).detach() / m_;
  loss_sum_ = loss_sum_.defined() ? loss_sum_ + loss : loss;
}

void Executor::Backward(const Action& a) {
  Slot& s = At(a.chunk, a.microbatch);
  const bool first = First(a.chunk), last = Last(a.chunk);
  if (captured_) {
    GraphSlot& g = *graph_slots_[graph_slot_of_[a.microbatch]];
    if (g.grad_output.defined()) g.grad_output.copy_(s.grad_in);
    g.backward.replay();
    if (g.grad_input.defined()) {
      if (!s.grad_out_buffer.defined()) s.grad_out_buffer = torch::empty_like(g.grad_input);
      s.grad_out_buffer.copy_(g.grad_input);
      s.grad_out = s.grad_out_buffer;
    }
    return;
  }
  Stage& stage = *chunks_[a.chunk];
  if (a.kind == ActionKind::kBackwardWeight) {  // after this chunk's I of the micro-batch
    stage.BackwardWeight(s.output, s.grad_for_weight);
    s.input = s.output = s.grad_for_weight = torch::Tensor();
    return;
  }
  torch::Tensor grad;
  if (!last) {
    const int next = LocalChunk(chunk_stage_, a.stage + 1);
    grad = next >= 0 ? At(next, a.microbatch).grad_out : s.grad_in;
  }
  if (a.kind == ActionKind::kBackwardInput) {
    // The first stage too (its input is tokens: no gradient to give), so that a stage that defers its
    // weight gradients does the backward's activation work here and only the weight GEMMs at W.
    s.grad_out = stage.BackwardInput(first ? torch::Tensor() : s.input, s.output, grad);
    s.grad_for_weight = grad;
    return;
  }
  stage.Backward(s.output, grad);
  if (!first) s.grad_out = s.input.grad();
  s.input = torch::Tensor();
  s.output = torch::Tensor();
}

// Assigns micro-batches to graph slots (AssignSlots: in inference the forward's output is copied out, so
// a slot is free again at once) and captures each slot's forward and backward on the compute stream.
void Executor::Capture() {
  const SlotPlan plan = AssignSlots(actions_, m_, /*release_after_forward=*/!training_);
  graph_slot_of_ = plan.slot_of;
  for (int k = 0; k < plan.slots; ++k) {
    graph_slots_.push_back(
        CaptureSlot(*chunks_[0], o_.micro_batch, o_.seq, First(0), Last(0), !training_, m_, o_.device));
  }
}

// Posts a send/receive group (or a single operation) on the communication stream.
absl::Status Executor::Communicate(const std::vector<Action>& group) {
  std::vector<Transport::P2POp> ops;
  bool any_send = false;
  for (const Action& x : group) any_send |= IsSend(x.kind);
  if (any_send) streams_->CommAfterCompute();
  for (const Action& x : group) {
    Slot& s = At(x.chunk, x.microbatch);
    Stage& stage = *chunks_[x.chunk];
    torch::Tensor t;
    switch (x.kind) {
      case ActionKind::kSendForward:
        t = s.output.defined() ? s.output.detach() : t;
        break;
      case ActionKind::kSendBackward:
        t = s.grad_out;
        break;
      case ActionKind::kRecvForward:
        if (!s.act_in.defined()) s.act_in = Empty(stage.Input(o_.micro_batch), o_.device);
        t = s.act_in;
        break;
      case ActionKind::kRecvBackward:
        if (!s.grad_in.defined()) s.grad_in = Empty(stage.Output(o_.micro_batch), o_.device);
        t = s.grad_in;
        break;
      default:
        return absl::InternalError("not a communication action");
    }
    if (!t.defined() || !t.is_contiguous()) {
      return absl::FailedPreconditionError(
          absl::StrCat(ToString(x),
                       ": nothing to send (the list sends before it computes, or the stage's output is not "
                       "contiguous)"));
    }
    if (IsSend(x.kind)) streams_->KeepForComm(t);
    ops.push_back({IsSend(x.kind), t.data_ptr(), static_cast<int64_t>(t.nbytes()), x.peer});
  }
  int64_t bytes = 0;
  for (const Transport::P2POp& op : ops) bytes += op.bytes;
  timer_.StartComm();
  absl::Status st = ops.size() == 1 ? (ops[0].send ? transport_->Send(ops[0].data, ops[0].bytes, ops[0].peer)
                                                   : transport_->Recv(ops[0].data, ops[0].bytes, ops[0].peer))
                                    : transport_->Group(ops);
  if (!st.ok()) return st;
  timer_.EndComm(group, bytes);
  auto done = streams_->MarkComm();
  for (const Action& x : group) {
    Slot& s = At(x.chunk, x.microbatch);
    if (x.kind == ActionKind::kRecvForward) s.act_ready = done;
    if (x.kind == ActionKind::kRecvBackward) s.grad_ready = done;
    if (x.kind == ActionKind::kSendBackward) s.grad_out = torch::Tensor();
    if (x.kind == ActionKind::kSendForward && (!training_ || evaluating_))
      s.output = torch::Tensor();  // no backward needs it
  }
  return absl::OkStatus();
}

absl::Status Executor::Compute(const Action& x) {
  // The compute stream waits for the receive this action needs, before its timing starts: the wait
  // shows as its own slice.
  std::string waited_for;
  if (x.kind != ActionKind::kOptimizerStep) {
    Slot& s = At(x.chunk, x.microbatch);
    Action received = x;  // the receive this compute waits for, named as the list names it
    if (x.kind == ActionKind::kForward && s.act_ready) {
      streams_->ComputeAfter(s.act_ready);
      received.kind = ActionKind::kRecvForward;
      waited_for = ToString(received);
    } else if ((x.kind == ActionKind::kBackward || x.kind == ActionKind::kBackwardInput) && s.grad_ready) {
      streams_->ComputeAfter(s.grad_ready);
      received.kind = ActionKind::kRecvBackward;
      waited_for = ToString(received);
    }
  }
  timer_.StartCompute();
  switch (x.kind) {
    case ActionKind::kForward:
      Forward(x);
      break;
    case ActionKind::kBackward:
    case ActionKind::kBackwardInput:
    case ActionKind::kBackwardWeight:
      Backward(x);
      break;
    case ActionKind::kOptimizerStep:
      if (o_.grad_clip > 0) {  // --grad_clip with replicas is refused before the job starts
        if (absl::Status s = ClipGradients(); !s.ok()) return s;
      }
      if (sync_ != nullptr) {
        if (absl::Status s = sync_->Step(*optimizer_); !s.ok()) return s;
      } else {
        optimizer_->Step(/*zero_grads=*/graphs_);  // zeroed in its pass where ZeroGrad would zero them
      }
      optimizer_->ZeroGrad(/*set_to_none=*/!graphs_);  // captured graphs accumulate into fixed gradients
      break;
    default:
      return absl::UnimplementedError(absl::StrCat("the executor does not run ", ActionKindName(x.kind), " actions"));
  }
  timer_.EndCompute(x, std::move(waited_for));
  return absl::OkStatus();
}

// Every rank adds its squared gradient norm into one all-reduce over the transport (the list puts the
// optimizer step last on every rank, so the collective comes in the same order everywhere).
absl::Status Executor::ClipGradients() {
  absl::Status status;
  ClipGradNorm(Parameters(), o_.grad_clip, [&](torch::Tensor& sumsq) {
    if (transport_ == nullptr || transport_->world_size() == 1) return;
    streams_->CommAfterCompute();
    status = transport_->AllReduceSum(sumsq.data_ptr(), 1, DType::kFloat32);
    streams_->ComputeAfter(streams_->MarkComm());
  });
  return status;
}

// Runs actions_[i] (and the rest of its group), advancing i past them.
absl::Status Executor::Run(size_t& i) {
  const std::vector<Action>& actions = *running_;
  const Action& x = actions[i];
  if (IsCommunication(x.kind)) {
    std::vector<Action> group{x};
    while (x.group >= 0 && i + 1 < actions.size() && actions[i + 1].group == x.group) group.push_back(actions[++i]);
    ++i;
    return Communicate(group);
  }
  ++i;
  return Compute(x);
}

// Data parallelism: the chunks whose gradients became complete within actions [from, to) (their last
// backward and the sends right after it, so that on GPUs the reduction queues behind those sends)
// start their reduction across the replicas beside what follows.
void Executor::NotifyGradients(size_t from, size_t to) {
  for (size_t c = 0; c < last_backward_.size(); ++c) {
    const int last = last_backward_[c];
    if (last >= static_cast<int>(from) && last < static_cast<int>(to)) sync_->GradientsReady(static_cast<int>(c));
  }
}

absl::StatusOr<StepResult> Executor::Step(int64_t step) {
  const auto t0 = std::chrono::steady_clock::now();
  step_ = step;
  loss_sum_ = torch::Tensor();
  std::optional<c10::cuda::CUDAStreamGuard> guard;  // every kernel of the step on the compute stream
  if (streams_->cuda()) guard.emplace(streams_->compute());
  timer_.BeginStep();
  LoadBatch(*data_, step_, 0, training_ || o_.inference_loss);
  if (graphs_) {
    for (auto& c : chunks_) c->PrepareForGraphs();  // the optimizer's update, into what the graphs read
    if (!captured_ && steps_run_ >= 1) {
      try {
        Capture();
      } catch (const c10::Error& e) {
        return absl::InternalError(absl::StrCat("rank ", o_.rank, ": capturing the stage's CUDA graphs: ",
                                                e.what_without_backtrace(), "; --cuda_graphs=false runs without"));
      }
      captured_ = true;
    }
  }
  streams_->CommAfterCompute();  // receive buffers are free once the previous step's compute is done
  for (size_t i = 0; i < actions_.size();) {
    const size_t at = i;
    absl::Status s;
    try {
      s = Run(i);
    } catch (const c10::Error& e) {
      s = absl::InternalError(absl::StrCat("LibTorch: ", e.what_without_backtrace()));
    }
    if (s.ok() && sync_ != nullptr) NotifyGradients(at, i);
    if (!s.ok()) {
      failed_action_ = static_cast<int>(at);
      return absl::Status(
          s.code(), absl::StrCat("rank ", o_.rank, ", ", ToString(actions_[at]), " (step ", step, "): ", s.message()));
    }
  }
  ++steps_run_;
  PrefetchBatch(*data_, step + 1, 0);  // while the GPU runs the step's queued kernels
  StepResult r;
  r.step = step;
  if (loss_sum_.defined() && sync_ != nullptr) {
    absl::StatusOr<double> mean = sync_->MeanLoss(loss_sum_);  // the global batch's, as one process's
    if (!mean.ok())
      return absl::Status(mean.status().code(), absl::StrCat("rank ", o_.rank, ": ", mean.status().message()));
    r.has_loss = sync_->ReportsLoss();
    r.loss = *mean;
  } else if (loss_sum_.defined()) {
    r.has_loss = true;
    r.loss = loss_sum_.item<double>();
  }
  streams_->Synchronize();
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  r.timing = timer_.Finish(o_.rank, step, r.seconds * 1e3);
  r.tokens = m_ * o_.micro_batch * o_.seq * o_.replicas;  // the global batch's, every replica's
  if (o_.device.is_cuda()) {
    const auto aggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    r.peak_memory_bytes = c10::cuda::CUDACachingAllocator::getDeviceStats(0).allocated_bytes[aggregate].peak;
  }
  return r;
}

absl::StatusOr<std::optional<double>> Executor::Evaluate(const TokenSource& val, int batches) {
  std::optional<c10::cuda::CUDAStreamGuard> guard;
  if (streams_->cuda()) guard.emplace(streams_->compute());
  evaluating_ = true;
  running_ = &eval_actions_;
  for (auto& c : chunks_) c->SetTraining(false);
  timer_.BeginStep();  // the next step's BeginStep drops what evaluation recorded
  torch::Tensor total;
  absl::Status status;
  for (int b = 0; b < batches && status.ok(); ++b) {
    loss_sum_ = torch::Tensor();
    LoadBatch(val, 0, b, /*targets=*/true);
    streams_->CommAfterCompute();  // receive buffers are free once the previous compute is done
    for (size_t i = 0; i < eval_actions_.size();) {
      const size_t at = i;
      try {
        status = Run(i);
      } catch (const c10::Error& e) {
        status = absl::InternalError(absl::StrCat("LibTorch: ", e.what_without_backtrace()));
      }
      if (!status.ok()) {
        status = absl::Status(status.code(), absl::StrCat("rank ", o_.rank, ", ", ToString(eval_actions_[at]),
                                                          " (evaluation batch ", b, "): ", status.message()));
        break;
      }
    }
    if (status.ok() && loss_sum_.defined()) total = total.defined() ? total + loss_sum_ : loss_sum_;
  }
  streams_->Synchronize();
  for (auto& c : chunks_) c->SetTraining(training_);
  evaluating_ = false;
  running_ = &actions_;
  loss_sum_ = torch::Tensor();
  for (Slot& s : slots_) s.input = s.output = torch::Tensor();
  if (!status.ok()) return status;
  if (!total.defined()) return std::optional<double>();
  return std::optional<double>(total.item<double>() / batches);
}

}  // namespace stagehand
