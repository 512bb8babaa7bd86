// Data parallelism (see data_parallel.h). LibTorch translation unit.
#include "worker/data_parallel.h"

#include <c10/cuda/CUDAGuard.h>

#include <algorithm>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "engine/stage.h"

namespace stagehand {

std::vector<std::vector<int>> PlanBuckets(const std::vector<int64_t>& param_bytes, int64_t bucket_bytes) {
  std::vector<std::vector<int>> buckets;
  int64_t filled = 0;
  for (int i = static_cast<int>(param_bytes.size()) - 1; i >= 0; --i) {
    if (buckets.empty() || filled >= bucket_bytes) {
      buckets.emplace_back();
      filled = 0;
    }
    buckets.back().push_back(i);
    filled += param_bytes[i];
  }
  return buckets;
}

Shard ShardOf(int64_t total, int replicas, int index) {
  Shard s;
  s.size = (total + replicas - 1) / replicas;
  s.padded = s.size * replicas;
  s.begin = s.size * index;
  return s;
}

namespace {

absl::StatusOr<DType> DTypeOf(const torch::Tensor& t) {
  switch (t.scalar_type()) {
    case torch::kFloat32:
      return DType::kFloat32;
    case torch::kFloat64:
      return DType::kFloat64;
    case torch::kBFloat16:
      return DType::kBFloat16;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("data parallelism: parameters of dtype ", c10::toString(t.scalar_type()), " are not reduced"));
  }
}

// The bucket's parameters (or their gradients, zeros where none) laid end to end into `flat`.
void Flatten(const std::vector<torch::Tensor>& params, torch::Tensor& flat, bool grads) {
  torch::NoGradGuard no_grad;
  int64_t at = 0;
  for (const torch::Tensor& p : params) {
    torch::Tensor part = flat.narrow(0, at, p.numel());
    const torch::Tensor& src = grads ? p.grad() : p;
    if (src.defined()) {
      part.copy_(src.reshape({-1}));
    } else {
      part.zero_();
    }
    at += p.numel();
  }
  if (at < flat.numel()) flat.narrow(0, at, flat.numel() - at).zero_();  // the shards' padding
}

}  // namespace

DataParallel::DataParallel(DataParallelOptions options, std::vector<std::vector<torch::Tensor>> chunks,
                           Transport* group, Streams* streams)
    : o_(std::move(options)), group_(group), streams_(streams) {
  const int d = group_->world_size();
  std::vector<torch::Tensor> shard_params;
  for (size_t c = 0; c < chunks.size(); ++c) {
    std::vector<int64_t> bytes;
    for (const torch::Tensor& p : chunks[c]) bytes.push_back(p.numel() * p.element_size());
    for (const std::vector<int>& indices : PlanBuckets(bytes, o_.bucket_bytes)) {
      Bucket b;
      b.chunk = static_cast<int>(c);
      int64_t numel = 0;
      for (int i : indices) {
        b.params.push_back(chunks[c][i]);
        numel += chunks[c][i].numel();
      }
      b.shard = ShardOf(numel, o_.shard_optimizer ? d : 1, o_.shard_optimizer ? group_->rank() : 0);
      b.flat = torch::empty({b.shard.padded}, b.params[0].options().requires_grad(false));
      if (o_.shard_optimizer) {
        // Every replica starts from the same parameters (they depend on the seed alone).
        torch::Tensor whole = torch::empty_like(b.flat);
        Flatten(b.params, whole, /*grads=*/false);
        b.shard_param = whole.narrow(0, b.shard.begin, b.shard.size).clone().requires_grad_(true);
        shard_params.push_back(b.shard_param);
      }
      buckets_.push_back(std::move(b));
    }
  }
  if (o_.shard_optimizer) {
    shard_optimizer_ = std::make_unique<FusedAdamW>(shard_params, o_.lr, 0.9, 0.95, 1e-8, 0.1, o_.fused_optimizer);
  }
}

DataParallel::~DataParallel() { (void)Wait(); }

int64_t DataParallel::OptimizerElements() const {
  int64_t n = 0;
  for (const Bucket& b : buckets_) {
    for (const torch::Tensor& p : b.params) n += p.numel();
  }
  if (!o_.shard_optimizer) return n;
  n = 0;
  for (const Bucket& b : buckets_) n += b.shard.size;
  return n;
}

absl::Status DataParallel::Reduce(Bucket& b) {
  absl::StatusOr<DType> dtype = DTypeOf(b.flat);
  if (!dtype.ok()) return dtype.status();
  Flatten(b.params, b.flat, /*grads=*/true);
  if (!o_.shard_optimizer) return group_->AllReduceSum(b.flat.data_ptr(), b.flat.numel(), *dtype);
  // In place: this replica's block of `flat` receives the sum of everyone's.
  void* own = b.flat.narrow(0, b.shard.begin, b.shard.size).data_ptr();
  return group_->ReduceScatterSum(b.flat.data_ptr(), own, b.shard.size, *dtype);
}

void DataParallel::GradientsReady(int chunk) {
  auto reduce_chunk = [this, chunk]() -> absl::Status {
    for (Bucket& b : buckets_) {
      if (b.chunk != chunk) continue;
      if (absl::Status s = Reduce(b); !s.ok()) return s;
    }
    return absl::OkStatus();
  };
  if (streams_ != nullptr && streams_->cuda()) {
    // Enqueued on the communication stream after the backward; the collectives run there in order.
    streams_->CommAfterCompute();
    c10::cuda::CUDAStreamGuard guard(streams_->comm());
    results_.push_back(reduce_chunk());
    return;
  }
  auto result = std::make_shared<absl::Status>();
  pending_.push_back(result);
  // One chunk's reductions after another's: the replica group carries one collective at a time.
  std::thread previous = std::move(running_);
  running_ = std::thread([result, reduce_chunk, previous = std::move(previous)]() mutable {
    if (previous.joinable()) previous.join();
    try {
      *result = reduce_chunk();
    } catch (const c10::Error& e) {
      *result = absl::InternalError(absl::StrCat("LibTorch: ", e.what_without_backtrace()));
    }
  });
}

absl::Status DataParallel::Wait() {
  if (running_.joinable()) running_.join();
  absl::Status first;
  for (const absl::Status& s : results_) first.Update(s);
  for (const auto& s : pending_) first.Update(*s);
  results_.clear();
  pending_.clear();
  return first.ok() ? first
                    : absl::Status(first.code(), absl::StrCat("reducing gradients across replicas: ", first.message()));
}

absl::Status DataParallel::Average(Bucket& b) {
  torch::NoGradGuard no_grad;
  const double d = group_->world_size();
  if (o_.shard_optimizer) {
    b.shard_param.mutable_grad() = b.flat.narrow(0, b.shard.begin, b.shard.size).div(d);
    return absl::OkStatus();
  }
  b.flat.div_(d);
  int64_t at = 0;
  for (torch::Tensor& p : b.params) {
    torch::Tensor mean = b.flat.narrow(0, at, p.numel()).view(p.sizes());
    if (p.grad().defined()) {
      p.mutable_grad().copy_(mean);
    } else {
      p.mutable_grad() = mean.clone();
    }
    at += p.numel();
  }
  return absl::OkStatus();
}

absl::Status DataParallel::GatherParams(Bucket& b) {
  torch::NoGradGuard no_grad;
  absl::StatusOr<DType> dtype = DTypeOf(b.flat);
  if (!dtype.ok()) return dtype.status();
  b.flat.narrow(0, b.shard.begin, b.shard.size).copy_(b.shard_param);
  void* own = b.flat.narrow(0, b.shard.begin, b.shard.size).data_ptr();
  if (absl::Status s = group_->AllGather(own, b.flat.data_ptr(), b.shard.size, *dtype); !s.ok()) return s;
  int64_t at = 0;
  for (torch::Tensor& p : b.params) {
    // In place, moving the version counter: the linear layers' bf16 copies see the update.
    p.copy_(b.flat.narrow(0, at, p.numel()).view(p.sizes()));
    at += p.numel();
  }
  return absl::OkStatus();
}

absl::Status DataParallel::Step(FusedAdamW& optimizer) {
  if (absl::Status s = Wait(); !s.ok()) return s;
  const bool cuda = streams_ != nullptr && streams_->cuda();
  std::optional<c10::cuda::CUDAStreamGuard> guard;
  if (cuda) guard.emplace(streams_->comm());
  for (Bucket& b : buckets_) {
    if (absl::Status s = Average(b); !s.ok()) return s;
  }
  guard.reset();
  if (cuda) streams_->ComputeAfter(streams_->MarkComm());
  if (!o_.shard_optimizer) {
    optimizer.Step();
    return absl::OkStatus();
  }
  shard_optimizer_->Step();
  if (cuda) {
    streams_->CommAfterCompute();
    guard.emplace(streams_->comm());
  }
  for (Bucket& b : buckets_) {
    if (absl::Status s = GatherParams(b); !s.ok()) return s;
  }
  guard.reset();
  if (cuda) streams_->ComputeAfter(streams_->MarkComm());
  return absl::OkStatus();
}

absl::StatusOr<double> DataParallel::MeanLoss(const torch::Tensor& loss) {
  torch::NoGradGuard no_grad;
  torch::Tensor sum = loss.detach().to(torch::kFloat64).reshape({1}).clone();
  std::optional<c10::cuda::CUDAStreamGuard> guard;
  if (sum.is_cuda()) {  // NCCL reduces device memory, after the compute that made the loss
    streams_->CommAfterCompute();
    guard.emplace(streams_->comm());
  }
  if (absl::Status s = group_->AllReduceSum(sum.data_ptr(), 1, DType::kFloat64); !s.ok()) return s;
  return sum.item<double>() / group_->world_size();
}

int ReplicaOf(const Assignment& a) {
  for (int i = 0; i < a.replica_group_size(); ++i) {
    if (a.replica_group(i) == a.rank()) return i;
  }
  return 0;
}

absl::StatusOr<std::unique_ptr<DataParallel>> AttachDataParallel(const Assignment& a, Transport* world,
                                                                 Executor& executor, Streams* streams) {
  if (a.replica_group_size() <= 1) return nullptr;
  if (a.job().pipeline().inference()) return nullptr;  // forward only: nothing to average
  if (world == nullptr) return absl::InvalidArgumentError("data parallelism without a transport");
  std::vector<int> members(a.replica_group().begin(), a.replica_group().end());
  absl::StatusOr<std::unique_ptr<Transport>> group = world->Split(a.replica_group_color(), members);
  if (!group.ok()) return group.status();
  const JobSpec& job = a.job();
  DataParallelOptions o;
  o.shard_optimizer = job.shard_optimizer();
  const double mib = job.has_bucket_mb() ? job.bucket_mb() : job.device() == "cuda" ? 25 : 1;
  o.bucket_bytes = std::max<int64_t>(1, static_cast<int64_t>(mib * (1 << 20)));
  o.lr = job.lr();
  o.fused_optimizer = ModelOptionOn(job.model_spec(), "fused_optimizer");
  auto dp = std::make_unique<DataParallel>(o, executor.ChunkParameters(), group->get(), streams);
  dp->owned_group_ = *std::move(group);
  executor.SetReplicaSync(dp.get());
  return dp;
}

}  // namespace stagehand
