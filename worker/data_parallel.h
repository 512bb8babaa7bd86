// Data parallelism for a pipeline rank: the replicas of a stage (the ranks that hold the same stages,
// one per replica) average their gradients over a replica group (Transport::Split) in buckets,
// launched as the executor finishes each chunk's last backward of the step and waited before the
// optimizer, as DDP does; with shard_optimizer (ZeRO stage 1) each replica reduce-scatters the
// buckets, steps AdamW on its 1/D shard of them and all-gathers the updated parameters. Knows no model
// family: it sees parameters and gradients.
#ifndef STAGEHAND_WORKER_DATA_PARALLEL_H_
#define STAGEHAND_WORKER_DATA_PARALLEL_H_

#include <torch/torch.h>

#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "engine/executor.h"
#include "engine/step_timer.h"
#include "nn/nn.h"
#include "protos/job.pb.h"
#include "transport/transport.h"

namespace stagehand {

// Buckets of parameter indices, taken last-first (the backward produces the last layers' gradients
// first), each closed once it holds at least `bucket_bytes`; a parameter is never split.
std::vector<std::vector<int>> PlanBuckets(const std::vector<int64_t>& param_bytes, int64_t bucket_bytes);

// Replica `index`'s part of `total` elements padded to a multiple of `replicas`: [begin, begin + size).
struct Shard {
  int64_t begin = 0;
  int64_t size = 0;    // ceil(total / replicas): every replica's shard has the same size
  int64_t padded = 0;  // size * replicas
};
Shard ShardOf(int64_t total, int replicas, int index);

struct DataParallelOptions {
  bool shard_optimizer = false;
  int64_t bucket_bytes = int64_t{25} << 20;  // DDP's default; smaller on the CPU
  double lr = 1e-4;                          // the sharded optimizer's (ZeRO-1)
  bool fused_optimizer = true;               // its own kernel (FusedAdamW; --model_option=fused_optimizer)
};

class DataParallel : public ReplicaSync {
 public:
  // `chunks[c]` are the parameters of the rank's chunk c; `group` the replica group (its rank is this
  // replica's index), which must outlive this. `streams` orders the reductions after the backward on GPUs.
  DataParallel(DataParallelOptions options, std::vector<std::vector<torch::Tensor>> chunks, Transport* group,
               Streams* streams);
  ~DataParallel() override;

  void GradientsReady(int chunk) override;
  absl::Status Step(FusedAdamW& optimizer) override;
  absl::StatusOr<double> MeanLoss(const torch::Tensor& loss) override;
  bool ReportsLoss() const override { return group_->rank() == 0; }

  int replicas() const { return group_->world_size(); }
  // For tests: the optimizer state this replica holds, in elements (ZeRO-1: about 1/D of the whole).
  int64_t OptimizerElements() const;

 private:
  struct Bucket {
    int chunk = 0;
    std::vector<torch::Tensor> params;  // in bucket order
    torch::Tensor flat;                 // the gradients, flattened (padded to a multiple of D when sharded)
    Shard shard;                        // sharded: this replica's part of `flat`
    torch::Tensor shard_param;          // sharded: this replica's part of the parameters, a leaf
  };
  absl::Status Reduce(Bucket& b);        // launched by GradientsReady
  absl::Status Average(Bucket& b);       // after the reduction: the mean back into the gradients
  absl::Status GatherParams(Bucket& b);  // sharded: the updated shards into every replica's parameters
  absl::Status Wait();

  const DataParallelOptions o_;
  Transport* const group_;
  Streams* const streams_;
  std::vector<Bucket> buckets_;
  std::unique_ptr<FusedAdamW> shard_optimizer_;
  // On the CPU the reductions run on a thread while the schedule goes on (a chunk's after the one before).
  std::thread running_;
  std::vector<absl::Status> results_;                   // reductions done on this thread (GPUs)
  std::vector<std::shared_ptr<absl::Status>> pending_;  // the threads' results (CPU)
  std::unique_ptr<Transport> owned_group_;              // when made by AttachDataParallel
  friend absl::StatusOr<std::unique_ptr<DataParallel>> AttachDataParallel(const Assignment&, Transport*, Executor&,
                                                                          Streams*);
};

// The rank's data parallelism as its Assignment says (null when it has one replica): splits `world`
// into the replica groups (every rank calls this, at the same point) and hooks into `executor`.
absl::StatusOr<std::unique_ptr<DataParallel>> AttachDataParallel(const Assignment& assignment, Transport* world,
                                                                 Executor& executor, Streams* streams);
// This rank's replica index in its Assignment (0 without data parallelism).
int ReplicaOf(const Assignment& assignment);

}  // namespace stagehand

#endif  // STAGEHAND_WORKER_DATA_PARALLEL_H_
