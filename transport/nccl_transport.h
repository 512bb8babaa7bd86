// The GPU transport: one NCCL communicator per transport, set up through the coordinator's key-value
// store (rank 0 publishes the unique id) with a deadline, non-blocking so that it can be aborted.
#ifndef STAGEHAND_TRANSPORT_NCCL_TRANSPORT_H_
#define STAGEHAND_TRANSPORT_NCCL_TRANSPORT_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "transport/transport.h"

namespace stagehand {

struct NcclTransportOptions {
  int rank = 0;
  int world_size = 1;
  std::string key_prefix;                           // namespaces the unique id's key (job id, communicator name)
  absl::Duration init_timeout = absl::Seconds(60);  // unique id exchange plus ncclCommInitRank
  void* stream = nullptr;                           // the cudaStream_t operations are enqueued on
  int max_ctas = 0;                                 // NCCL's maxCTAs (thread blocks per operation); 0: its default
};

// Creates the communicator. DEADLINE_EXCEEDED (after aborting it) when it is not ready in time.
absl::StatusOr<std::unique_ptr<Transport>> ConnectNcclTransport(const NcclTransportOptions& options, KeyValueStore& kv);

}  // namespace stagehand

#endif  // STAGEHAND_TRANSPORT_NCCL_TRANSPORT_H_
