// The names of the control service's roles (view, submit, admin), for the server and the client.
#ifndef STAGEHAND_CONTROL_ROLES_H_
#define STAGEHAND_CONTROL_ROLES_H_

#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "protos/control.pb.h"

namespace stagehand {

// "view", "submit", "admin"; "unspecified" for anything else.
std::string RoleName(control::Role role);
// INVALID_ARGUMENT naming the three roles.
absl::StatusOr<control::Role> ParseRole(absl::string_view name);

}  // namespace stagehand

#endif  // STAGEHAND_CONTROL_ROLES_H_
