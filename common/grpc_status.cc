// absl::Status <-> grpc::Status (see grpc_status.h).
#include "common/grpc_status.h"

#include <cstdlib>
#include <string>

#include "grpc/support/log.h"

#include "absl/strings/str_cat.h"

namespace stagehand {

grpc::Status ToGrpcStatus(const absl::Status& status) {
  if (status.ok()) return grpc::Status::OK;
  // absl and gRPC share the canonical code numbers.
  return grpc::Status(static_cast<grpc::StatusCode>(status.code()), std::string(status.message()));
}

absl::Status FromGrpcStatus(const grpc::Status& status, absl::string_view rpc) {
  if (status.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status.error_code()),
                      absl::StrCat(rpc, ": ", status.error_message()));
}

void QuietGrpcLogs() {
  const char* verbosity = std::getenv("GRPC_VERBOSITY");
  if (verbosity != nullptr && verbosity[0] != '\0') return;  // the user asked for them
  gpr_set_log_function([](gpr_log_func_args*) {});
}

}  // namespace stagehand
