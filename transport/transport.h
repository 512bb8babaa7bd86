// The communication interface of a worker, with two implementations: NCCL on GPUs
// (nccl_transport.h) and a CPU transport over TCP for machines without GPUs and for CI
// (cpu_transport.h). Buffers are raw pointers so that transports need no LibTorch headers.
#ifndef STAGEHAND_TRANSPORT_TRANSPORT_H_
#define STAGEHAND_TRANSPORT_TRANSPORT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace stagehand {

enum class DType { kFloat32, kFloat64, kBFloat16, kInt64 };

int64_t DTypeSize(DType dtype);

// Operations run in the order they are called. On the NCCL transport they are enqueued on the stream
// the transport was made with (like any other GPU work) and the call returns once they are enqueued;
// on the CPU transport they are complete when the call returns.
class Transport {
 public:
  virtual ~Transport() = default;
  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::string name() const = 0;  // "nccl" or "cpu"

  // In place: every rank ends with the elementwise sum over ranks, bit-identical on every rank.
  virtual absl::Status AllReduceSum(void* data, int64_t count, DType dtype) = 0;
  virtual absl::Status Send(const void* data, int64_t bytes, int peer) = 0;
  virtual absl::Status Recv(void* data, int64_t bytes, int peer) = 0;

  // Point-to-point operations posted together (an NCCL group; sends beside receives on the CPU), so
  // that two ranks may send to each other at once without deadlock.
  struct P2POp {
    bool send = false;
    void* data = nullptr;
    int64_t bytes = 0;
    int peer = -1;
  };
  virtual absl::Status Group(const std::vector<P2POp>& ops) = 0;

  // Data parallelism's collectives. The defaults (transport.cc) run over Send/Recv through rank 0, in
  // rank order: deterministic and bit-identical on every rank (float32, float64, int64), for the CPU
  // and fake transports; NCCL runs its own. Every rank calls them with the same count and dtype.
  // `send` holds world_size() blocks of `count` elements; rank r gets the sum of every rank's block r
  // in `recv` (which may alias block r of `send`).
  virtual absl::Status ReduceScatterSum(const void* send, void* recv, int64_t count, DType dtype);
  // Every rank's `count` elements of `send`, into `recv` in rank order (world_size() * count elements;
  // `send` may alias this rank's block of `recv`).
  virtual absl::Status AllGather(const void* send, void* recv, int64_t count, DType dtype);

  // A communicator over `members`, ranks of this one; a member's rank in it is its index there. Every
  // rank of this transport calls Split once at the same point of its program, each with the group it
  // belongs to (the groups partition the ranks) and that group's `color` (>= 0, the same on its
  // members, different between groups): NCCL's ncclCommSplit. The default is a view that moves its
  // bytes over this transport's Send/Recv (so this transport must outlive it) and needs no exchange.
  // INVALID_ARGUMENT when this rank is not among `members` or a member is out of range.
  virtual absl::StatusOr<std::unique_ptr<Transport>> Split(int color, const std::vector<int>& members);

  // Makes every operation in flight and every later one fail instead of blocking. Safe to call from
  // another thread (a watchdog, or the heartbeat thread when the job is stopping).
  virtual void Abort() = 0;
};

// The rendezvous a transport needs: a write-once key-value store shared by the ranks of a job
// (the coordinator's, over gRPC; an in-memory one in tests).
class KeyValueStore {
 public:
  virtual ~KeyValueStore() = default;
  virtual absl::Status Set(const std::string& key, const std::string& value) = 0;
  // Waits up to `timeout` for the key; DEADLINE_EXCEEDED when it does not come.
  virtual absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) = 0;
};

}  // namespace stagehand

#endif  // STAGEHAND_TRANSPORT_TRANSPORT_H_
