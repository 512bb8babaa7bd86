// The in-process test transport (see fake_transport.h): one mutex over all ranks' pending operations,
// since tests run a handful of ranks and care for clarity, not throughput.
#include "transport/fake_transport.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace stagehand {

std::string ToString(const FakeOp& op) {
  switch (op.kind) {
    case FakeOp::kSend:
      return absl::StrCat("rank ", op.rank, " send ", op.bytes, " bytes to ", op.peer);
    case FakeOp::kRecv:
      return absl::StrCat("rank ", op.rank, " recv ", op.bytes, " bytes from ", op.peer);
    case FakeOp::kAllReduce:
      return absl::StrCat("rank ", op.rank, " all-reduce ", op.bytes, " bytes");
  }
  return "?";
}

FakeFabric::FakeFabric(int world_size, absl::Duration timeout)
    : world_size_(world_size), timeout_(timeout), aborted_(world_size, false), blocked_(world_size, 0) {}

std::string FakeFabric::Describe(const Pending& p) {
  return absl::StrCat("rank ", p.rank, ": ", p.send ? "send of " : "recv of ", p.bytes, " bytes ",
                      p.send ? "to" : "from", " rank ", p.peer);
}

void FakeFabric::RemoveLocked(Pending* p) {
  const Channel c = p->send ? Channel{p->rank, p->peer} : Channel{p->peer, p->rank};
  std::deque<Pending*>& q = (p->send ? sends_ : recvs_)[c];
  q.erase(std::remove(q.begin(), q.end(), p), q.end());
}

void FakeFabric::FailLocked(Pending* p, absl::Status s) {
  RemoveLocked(p);
  p->done = true;
  p->status = std::move(s);
}

// Matches the channel's oldest send with its oldest receive, as often as both are there.
void FakeFabric::MatchLocked(const Channel& c) {
  std::deque<Pending*>& sends = sends_[c];
  std::deque<Pending*>& recvs = recvs_[c];
  while (!sends.empty() && !recvs.empty()) {
    Pending* s = sends.front();
    Pending* r = recvs.front();
    sends.pop_front();
    recvs.pop_front();
    s->done = r->done = true;
    if (s->bytes != r->bytes) {
      const absl::Status st = absl::InvalidArgumentError(
          absl::StrCat("rank ", s->rank, " sends ", s->bytes, " bytes to rank ", r->rank, ", which receives ", r->bytes,
                       " bytes from it; the two lists disagree on the tensor"));
      s->status = r->status = st;
    } else if (s->bytes > 0) {
      std::memcpy(r->data, s->data, s->bytes);
    }
  }
  changed_.SignalAll();
}

absl::Status FakeFabric::Post(int rank, const std::vector<Transport::P2POp>& ops) {
  absl::MutexLock lock(&mu_);
  for (const Transport::P2POp& op : ops) {
    log_.push_back({rank, op.send ? FakeOp::kSend : FakeOp::kRecv, op.peer, op.bytes});
    if (op.peer < 0 || op.peer >= world_size_ || op.peer == rank || op.bytes < 0) {
      return absl::InvalidArgumentError(absl::StrCat("rank ", rank, ": ", op.send ? "send to" : "recv from", " peer ",
                                                     op.peer, " of ", op.bytes, " bytes in a world of ", world_size_));
    }
  }
  if (aborted_[rank]) return absl::CancelledError(absl::StrCat("rank ", rank, ": the transport was aborted"));
  std::vector<Pending> pending(ops.size());  // never resized: the queues point into it
  for (size_t i = 0; i < ops.size(); ++i) {
    Pending& p = pending[i];
    p = {rank, ops[i].send, ops[i].data, ops[i].bytes, ops[i].peer};
    if (aborted_[p.peer]) {
      p.done = true;
      p.status = absl::CancelledError(absl::StrCat(Describe(p), ": the peer aborted"));
      continue;
    }
    const Channel c = p.send ? Channel{rank, p.peer} : Channel{p.peer, rank};
    (p.send ? sends_ : recvs_)[c].push_back(&p);
    MatchLocked(c);
  }
  auto all_done = [&pending] {
    return std::all_of(pending.begin(), pending.end(), [](const Pending& p) { return p.done; });
  };
  const absl::Time deadline = absl::Now() + timeout_;
  ++blocked_[rank];
  changed_.SignalAll();
  while (!all_done()) {
    if (changed_.WaitWithDeadline(&mu_, deadline) && !all_done()) {
      for (Pending& p : pending) {
        if (p.done) continue;
        FailLocked(&p, absl::DeadlineExceededError(
                           absl::StrCat(Describe(p), " found no match within ", absl::FormatDuration(timeout_),
                                        " (the peer never posted the other end: a deadlocked list, or a test bug)")));
      }
    }
  }
  --blocked_[rank];
  for (const Pending& p : pending) {
    if (!p.status.ok()) return p.status;
  }
  return absl::OkStatus();
}

namespace {
template <typename T>
void SumInto(const std::vector<void*>& data, int64_t count) {
  std::vector<T> acc(static_cast<const T*>(data[0]), static_cast<const T*>(data[0]) + count);
  for (size_t r = 1; r < data.size(); ++r) {
    const T* x = static_cast<const T*>(data[r]);
    for (int64_t i = 0; i < count; ++i) acc[i] += x[i];
  }
  for (void* d : data) std::memcpy(d, acc.data(), count * sizeof(T));
}
}  // namespace

absl::Status FakeFabric::ReduceLocked() {
  switch (reduce_dtype_) {
    case DType::kFloat32:
      SumInto<float>(reduce_data_, reduce_count_);
      break;
    case DType::kFloat64:
      SumInto<double>(reduce_data_, reduce_count_);
      break;
    case DType::kInt64:
      SumInto<int64_t>(reduce_data_, reduce_count_);
      break;
    default:
      return absl::UnimplementedError("the fake transport sums float32, float64 and int64 only");
  }
  return absl::OkStatus();
}

absl::Status FakeFabric::AllReduceSum(int rank, void* data, int64_t count, DType dtype) {
  absl::MutexLock lock(&mu_);
  log_.push_back({rank, FakeOp::kAllReduce, -1, count * DTypeSize(dtype)});
  if (aborted_[rank]) return absl::CancelledError(absl::StrCat("rank ", rank, ": the transport was aborted"));
  if (dtype == DType::kBFloat16) {
    return absl::UnimplementedError("the fake transport sums float32, float64 and int64 only");
  }
  if (reduce_arrived_ == 0) {
    reduce_count_ = count;
    reduce_dtype_ = dtype;
    reduce_data_.assign(world_size_, nullptr);
  } else if (count != reduce_count_ || dtype != reduce_dtype_) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", rank, ": all-reduce of ", count, " elements while the others reduce ", reduce_count_));
  }
  reduce_data_[rank] = data;
  const int64_t round = reduce_round_;
  if (++reduce_arrived_ == world_size_) {
    const absl::Status s = ReduceLocked();
    reduce_arrived_ = 0;
    ++reduce_round_;
    changed_.SignalAll();
    return s;
  }
  auto any_aborted = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return std::find(aborted_.begin(), aborted_.end(), true) != aborted_.end();
  };
  const absl::Time deadline = absl::Now() + timeout_;
  ++blocked_[rank];
  changed_.SignalAll();
  absl::Status s;
  while (reduce_round_ == round && s.ok()) {
    if (any_aborted()) {
      s = absl::CancelledError(absl::StrCat("rank ", rank, ": all-reduce cancelled, a rank aborted"));
    } else if (changed_.WaitWithDeadline(&mu_, deadline) && reduce_round_ == round) {
      s = absl::DeadlineExceededError(absl::StrCat("rank ", rank, ": all-reduce of ", count,
                                                   " elements: not every rank joined within ",
                                                   absl::FormatDuration(timeout_)));
    }
  }
  if (!s.ok()) {
    reduce_data_[rank] = nullptr;
    --reduce_arrived_;
  }
  --blocked_[rank];
  return s;
}

void FakeFabric::Abort(int rank) {
  absl::MutexLock lock(&mu_);
  aborted_[rank] = true;
  std::vector<Pending*> hit;
  for (auto* queues : {&sends_, &recvs_}) {
    for (auto& [channel, q] : *queues) {
      for (Pending* p : q) {
        if (p->rank == rank || p->peer == rank) hit.push_back(p);
      }
    }
  }
  for (Pending* p : hit) {
    FailLocked(p, absl::CancelledError(absl::StrCat(
                      Describe(*p), p->rank == rank ? ": the transport was aborted" : ": the peer aborted")));
  }
  changed_.SignalAll();
}

void FakeFabric::AbortAll() {
  for (int r = 0; r < world_size_; ++r) Abort(r);
}

absl::Status FakeFabric::AwaitBlocked(int rank) {
  absl::MutexLock lock(&mu_);
  const absl::Time deadline = absl::Now() + timeout_;
  while (blocked_[rank] == 0) {
    if (changed_.WaitWithDeadline(&mu_, deadline) && blocked_[rank] == 0) {
      return absl::DeadlineExceededError(
          absl::StrCat("rank ", rank, " did not block in a transport call within ", absl::FormatDuration(timeout_)));
    }
  }
  return absl::OkStatus();
}

std::vector<FakeOp> FakeFabric::Ops() const {
  absl::MutexLock lock(&mu_);
  return log_;
}

std::vector<FakeOp> FakeFabric::OpsOf(int rank) const {
  absl::MutexLock lock(&mu_);
  std::vector<FakeOp> out;
  for (const FakeOp& op : log_) {
    if (op.rank == rank) out.push_back(op);
  }
  return out;
}

}  // namespace stagehand
