// A bool job option with its declared default (job_option.h).
#include "common/job_option.h"

#include <cstdio>
#include <cstdlib>

#include "protos/flag.pb.h"

namespace stagehand {

bool BoolOption(const google::protobuf::Message& message, int field_number) {
  const google::protobuf::FieldDescriptor* f = message.GetDescriptor()->FindFieldByNumber(field_number);
  if (f == nullptr || f->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_BOOL || f->is_repeated()) {
    // A programming error (the number is a generated constant): say which, and stop.
    std::fprintf(stderr, "BoolOption: %s has no bool field %d\n", message.GetDescriptor()->full_name().c_str(),
                 field_number);
    std::abort();
  }
  const google::protobuf::Reflection* r = message.GetReflection();
  if (r->HasField(message, f)) return r->GetBool(message, f);
  return f->options().GetExtension(flag).default_true();
}

}  // namespace stagehand
