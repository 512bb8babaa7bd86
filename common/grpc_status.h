// The one conversion between absl::Status and grpc::Status, at the gRPC boundary (the coordinator's
// service and its client): the codes are the same canonical numbers on both sides.
#ifndef STAGEHAND_COMMON_GRPC_STATUS_H_
#define STAGEHAND_COMMON_GRPC_STATUS_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

namespace stagehand {

grpc::Status ToGrpcStatus(const absl::Status& status);

// Prefixes the message with the RPC's name, so that a worker's log says which call failed.
absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view rpc);

}  // namespace stagehand

#endif  // STAGEHAND_COMMON_GRPC_STATUS_H_
