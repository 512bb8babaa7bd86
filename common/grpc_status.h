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

// Unless the user set GRPC_VERBOSITY, gRPC's own log lines ("E1203 ... ssl_transport_security.cc
// ...") are dropped: the client and the server say what went wrong in their own words. Call it first
// thing in main (any time works: it swaps gRPC's log function).
void QuietGrpcLogs();

}  // namespace stagehand

#endif  // STAGEHAND_COMMON_GRPC_STATUS_H_
