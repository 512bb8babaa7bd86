// NCCL transport (see nccl_transport.h). Communicators are non-blocking (config.blocking = 0) so that
// initialisation has a deadline and Abort() from another thread unblocks a stuck collective.
#include "transport/nccl_transport.h"

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace stagehand {
namespace {

absl::Status NcclError(ncclResult_t r, absl::string_view what) {
  return absl::InternalError(absl::StrCat(what, ": ", ncclGetErrorString(r), " (", ncclGetLastError(nullptr), ")"));
}

#define STAGEHAND_NCCL_RETURN_IF_ERROR(call)                                    \
  do {                                                                          \
    ncclResult_t r_ = (call);                                                   \
    if (r_ != ncclSuccess && r_ != ncclInProgress) return NcclError(r_, #call); \
  } while (0)

ncclDataType_t ToNccl(DType d) {
  switch (d) {
    case DType::kFloat32:
      return ncclFloat32;
    case DType::kFloat64:
      return ncclFloat64;
    case DType::kBFloat16:
      return ncclBfloat16;
    case DType::kInt64:
      return ncclInt64;
  }
  return ncclFloat32;
}

class NcclTransport final : public Transport {
 public:
  NcclTransport(ncclComm_t comm, int rank, int world, cudaStream_t stream)
      : comm_(comm), rank_(rank), world_(world), stream_(stream) {}
  ~NcclTransport() override {
    if (parent_ != nullptr) parent_->Forget(this);
    if (!aborted_.exchange(true)) ncclCommDestroy(comm_);
  }
  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  std::string name() const override { return "nccl"; }

  absl::Status AllReduceSum(void* data, int64_t count, DType dtype) override {
    if (aborted_) return absl::CancelledError("transport aborted");
    STAGEHAND_NCCL_RETURN_IF_ERROR(ncclAllReduce(data, data, count, ToNccl(dtype), ncclSum, comm_, stream_));
    return WaitEnqueued("ncclAllReduce");
  }
  absl::Status Send(const void* data, int64_t bytes, int peer) override {
    if (aborted_) return absl::CancelledError("transport aborted");
    STAGEHAND_NCCL_RETURN_IF_ERROR(ncclSend(data, bytes, ncclUint8, peer, comm_, stream_));
    return WaitEnqueued("ncclSend");
  }
  absl::Status Recv(void* data, int64_t bytes, int peer) override {
    if (aborted_) return absl::CancelledError("transport aborted");
    STAGEHAND_NCCL_RETURN_IF_ERROR(ncclRecv(data, bytes, ncclUint8, peer, comm_, stream_));
    return WaitEnqueued("ncclRecv");
  }
  absl::Status Group(const std::vector<P2POp>& ops) override {
    if (aborted_) return absl::CancelledError("transport aborted");
    STAGEHAND_NCCL_RETURN_IF_ERROR(ncclGroupStart());
    for (const P2POp& op : ops) {
      ncclResult_t r = op.send ? ncclSend(op.data, op.bytes, ncclUint8, op.peer, comm_, stream_)
                               : ncclRecv(op.data, op.bytes, ncclUint8, op.peer, comm_, stream_);
      if (r != ncclSuccess && r != ncclInProgress) {
        ncclGroupEnd();
        return NcclError(r, op.send ? "ncclSend" : "ncclRecv");
      }
    }
    STAGEHAND_NCCL_RETURN_IF_ERROR(ncclGroupEnd());
    return WaitEnqueued("ncclGroupEnd");
  }
  absl::Status ReduceScatterSum(const void* send, void* recv, int64_t count, DType dtype) override {
    if (aborted_) return absl::CancelledError("transport aborted");
    STAGEHAND_NCCL_RETURN_IF_ERROR(ncclReduceScatter(send, recv, count, ToNccl(dtype), ncclSum, comm_, stream_));
    return WaitEnqueued("ncclReduceScatter");
  }
  absl::Status AllGather(const void* send, void* recv, int64_t count, DType dtype) override {
    if (aborted_) return absl::CancelledError("transport aborted");
    STAGEHAND_NCCL_RETURN_IF_ERROR(ncclAllGather(send, recv, count, ToNccl(dtype), comm_, stream_));
    return WaitEnqueued("ncclAllGather");
  }
  // ncclCommSplit with the member's index as its key: the new ranks are the order of `members`. The
  // sub-communicator enqueues on this one's stream (so the replicas' reductions order with the
  // pipeline's transfers, the same on every rank) and is non-blocking like it.
  absl::StatusOr<std::unique_ptr<Transport>> Split(int color, const std::vector<int>& members) override {
    if (aborted_) return absl::CancelledError("transport aborted");
    const auto it = std::find(members.begin(), members.end(), rank_);
    if (it == members.end() || color < 0) {
      return absl::InvalidArgumentError(absl::StrCat("Split: rank ", rank_, " is not among the group's members"));
    }
    const int key = static_cast<int>(it - members.begin());
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = nullptr;
    STAGEHAND_NCCL_RETURN_IF_ERROR(ncclCommSplit(comm_, color, key, &comm, &config));
    if (absl::Status s = WaitEnqueued("ncclCommSplit"); !s.ok()) return s;
    for (;;) {  // the new communicator is ready when its own async state says so
      ncclResult_t state = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(comm, &state);
      if (r != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
        if (comm != nullptr) ncclCommAbort(comm);
        return NcclError(r != ncclSuccess ? r : state, "ncclCommSplit");
      }
      if (state == ncclSuccess) break;
      if (aborted_) {
        ncclCommAbort(comm);
        return absl::CancelledError("transport aborted");
      }
      std::this_thread::yield();
    }
    auto child = std::make_unique<NcclTransport>(comm, key, static_cast<int>(members.size()), stream_);
    child->parent_ = this;
    absl::MutexLock lock(&children_mu_);
    children_.push_back(child.get());
    return std::unique_ptr<Transport>(std::move(child));
  }
  // Aborts the communicators split from this one too: the job's stop reaches a replica reduction.
  void Abort() override {
    {
      absl::MutexLock lock(&children_mu_);
      for (NcclTransport* c : children_) c->Abort();
    }
    if (!aborted_.exchange(true)) ncclCommAbort(comm_);
  }

 private:
  // A non-blocking communicator may still be enqueuing when a call returns ncclInProgress.
  absl::Status WaitEnqueued(absl::string_view what) {
    for (;;) {
      if (aborted_) return absl::CancelledError("transport aborted");
      ncclResult_t state = ncclSuccess;
      ncclResult_t r = ncclCommGetAsyncError(comm_, &state);
      if (r != ncclSuccess) return NcclError(r, "ncclCommGetAsyncError");
      if (state == ncclSuccess) return absl::OkStatus();
      if (state != ncclInProgress) return NcclError(state, what);
      std::this_thread::yield();
    }
  }

  void Forget(NcclTransport* child) {
    absl::MutexLock lock(&children_mu_);
    children_.erase(std::remove(children_.begin(), children_.end(), child), children_.end());
  }

  ncclComm_t comm_;
  NcclTransport* parent_ = nullptr;  // the communicator this one was split from (which outlives it)
  absl::Mutex children_mu_;
  std::vector<NcclTransport*> children_ ABSL_GUARDED_BY(children_mu_);
  const int rank_;
  const int world_;
  cudaStream_t stream_;
  std::atomic<bool> aborted_{false};
};

absl::StatusOr<ncclUniqueId> ExchangeUniqueId(const NcclTransportOptions& o, KeyValueStore& kv, absl::Time deadline) {
  // The unique id lets anyone join the communicator: it goes only through the authenticated store
  // and is never logged.
  const std::string key = absl::StrCat(o.key_prefix, "/nccl/unique_id");
  ncclUniqueId id;
  if (o.rank == 0) {
    STAGEHAND_NCCL_RETURN_IF_ERROR(ncclGetUniqueId(&id));
    if (absl::Status s = kv.Set(key, std::string(id.internal, sizeof(id.internal))); !s.ok()) return s;
    return id;
  }
  absl::StatusOr<std::string> value = kv.Get(key, deadline - absl::Now());
  if (!value.ok()) return value.status();
  if (value->size() != sizeof(id.internal)) return absl::InternalError("malformed NCCL unique id in the store");
  std::copy(value->begin(), value->end(), id.internal);
  return id;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Transport>> ConnectNcclTransport(const NcclTransportOptions& o, KeyValueStore& kv) {
  const absl::Time deadline = absl::Now() + o.init_timeout;
  absl::StatusOr<ncclUniqueId> id = ExchangeUniqueId(o, kv, deadline);
  if (!id.ok()) return id.status();
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  if (o.max_ctas > 0) config.maxCTAs = o.max_ctas;  // NCCL_MAX_CTAS in the environment still wins
  ncclComm_t comm = nullptr;
  STAGEHAND_NCCL_RETURN_IF_ERROR(ncclCommInitRankConfig(&comm, o.world_size, *id, o.rank, &config));
  for (;;) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(comm, &state);
    if (r != ncclSuccess || (state != ncclSuccess && state != ncclInProgress)) {
      ncclCommAbort(comm);
      return NcclError(r != ncclSuccess ? r : state, "ncclCommInitRankConfig");
    }
    if (state == ncclSuccess) break;
    if (absl::Now() > deadline) {
      ncclCommAbort(comm);
      return absl::DeadlineExceededError(absl::StrCat("NCCL communicator not ready within ",
                                                      absl::FormatDuration(o.init_timeout), " (rank ", o.rank, " of ",
                                                      o.world_size, "); aborted it"));
    }
    absl::SleepFor(absl::Microseconds(200));
  }
  return std::unique_ptr<Transport>(new NcclTransport(comm, o.rank, o.world_size, static_cast<cudaStream_t>(o.stream)));
}

}  // namespace stagehand
