// An in-process Transport for tests: N ranks of one process (threads) meet on a shared FakeFabric,
// which matches each send with the peer's receive, copies the bytes and records every operation.
#ifndef STAGEHAND_TRANSPORT_FAKE_TRANSPORT_H_
#define STAGEHAND_TRANSPORT_FAKE_TRANSPORT_H_

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "transport/transport.h"

namespace stagehand {

// One operation as a rank posted it, for assertions on what the engine sent.
struct FakeOp {
  enum Kind { kSend, kRecv, kAllReduce };
  int rank = -1;
  Kind kind = kSend;
  int peer = -1;  // -1 for an all-reduce
  int64_t bytes = 0;
  bool operator==(const FakeOp& o) const {
    return rank == o.rank && kind == o.kind && peer == o.peer && bytes == o.bytes;
  }
};
std::string ToString(const FakeOp& op);

// What the ranks share. Sends and receives between two ranks match in the order they were posted (as
// NCCL's do); a send completes only when its receive is posted, so a list that would deadlock on a real
// transport deadlocks here too, and is caught by the bound on every wait instead of hanging the test.
class FakeFabric {
 public:
  explicit FakeFabric(int world_size, absl::Duration timeout = absl::Seconds(10));

  int world_size() const { return world_size_; }

  // Posts `ops` of `rank` at once and returns when every one has matched. INVALID_ARGUMENT for a bad
  // peer or when a matched pair disagrees on the byte count; CANCELLED once `rank` or the peer of a
  // pending op is aborted; DEADLINE_EXCEEDED naming the op that found no match within the timeout.
  absl::Status Post(int rank, const std::vector<Transport::P2POp>& ops);
  // Every rank calls it with the same count and dtype; float32, float64 and int64, summed in rank
  // order so that every rank gets the same bits.
  absl::Status AllReduceSum(int rank, void* data, int64_t count, DType dtype);

  // Pending and later operations of `rank`, and of any rank waiting on it, fail with CANCELLED.
  void Abort(int rank);
  void AbortAll();

  // Waits (within the timeout) until `rank` is blocked in a call; for tests that act while a rank waits.
  absl::Status AwaitBlocked(int rank);

  std::vector<FakeOp> Ops() const;
  std::vector<FakeOp> OpsOf(int rank) const;

 private:
  struct Pending {
    int rank = -1;
    bool send = false;
    void* data = nullptr;
    int64_t bytes = 0;
    int peer = -1;
    bool done = false;
    absl::Status status;
  };
  using Channel = std::pair<int, int>;  // (sender, receiver)

  void MatchLocked(const Channel& c) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void FailLocked(Pending* p, absl::Status s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void RemoveLocked(Pending* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  static std::string Describe(const Pending& p);
  absl::Status ReduceLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int world_size_;
  const absl::Duration timeout_;
  mutable absl::Mutex mu_;
  absl::CondVar changed_;  // signalled on every match, failure, abort and reduction
  std::map<Channel, std::deque<Pending*>> sends_ ABSL_GUARDED_BY(mu_), recvs_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> aborted_ ABSL_GUARDED_BY(mu_);
  std::vector<int> blocked_ ABSL_GUARDED_BY(mu_);  // per rank: calls waiting now
  std::vector<FakeOp> log_ ABSL_GUARDED_BY(mu_);
  // The all-reduce in progress: a round completes when every rank has put its buffer in.
  int64_t reduce_round_ ABSL_GUARDED_BY(mu_) = 0;
  int reduce_arrived_ ABSL_GUARDED_BY(mu_) = 0;
  std::vector<void*> reduce_data_ ABSL_GUARDED_BY(mu_);
  int64_t reduce_count_ ABSL_GUARDED_BY(mu_) = 0;
  DType reduce_dtype_ ABSL_GUARDED_BY(mu_) = DType::kFloat32;
};

// One rank's view of a FakeFabric (which must outlive it).
class FakeTransport : public Transport {
 public:
  FakeTransport(FakeFabric* fabric, int rank) : fabric_(fabric), rank_(rank) {}
  int rank() const override { return rank_; }
  int world_size() const override { return fabric_->world_size(); }
  std::string name() const override { return "fake"; }
  absl::Status AllReduceSum(void* data, int64_t count, DType dtype) override {
    return fabric_->AllReduceSum(rank_, data, count, dtype);
  }
  absl::Status Send(const void* data, int64_t bytes, int peer) override {
    // The fabric only reads a send's buffer.
    return fabric_->Post(rank_, {{true, const_cast<void*>(data), bytes, peer}});
  }
  absl::Status Recv(void* data, int64_t bytes, int peer) override {
    return fabric_->Post(rank_, {{false, data, bytes, peer}});
  }
  absl::Status Group(const std::vector<P2POp>& ops) override { return fabric_->Post(rank_, ops); }
  void Abort() override { fabric_->Abort(rank_); }

 private:
  FakeFabric* const fabric_;
  const int rank_;
};

}  // namespace stagehand

#endif  // STAGEHAND_TRANSPORT_FAKE_TRANSPORT_H_
