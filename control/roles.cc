#include "control/roles.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace stagehand {

std::string RoleName(control::Role role) {
  switch (role) {
    case control::ROLE_VIEW:
      return "view";
    case control::ROLE_SUBMIT:
      return "submit";
    case control::ROLE_ADMIN:
      return "admin";
    default:
      return "unspecified";
  }
}

absl::StatusOr<control::Role> ParseRole(absl::string_view name) {
  for (control::Role role : {control::ROLE_VIEW, control::ROLE_SUBMIT, control::ROLE_ADMIN}) {
    if (name == RoleName(role)) return role;
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown role '", name, "'; pass view, submit or admin"));
}

}  // namespace stagehand
