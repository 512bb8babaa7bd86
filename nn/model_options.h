// Model options (--model_option=NAME=VALUE, ModelSpec.options) that turn a mechanism off: for the
// building blocks here, the engine and the families alike (no LibTorch).
#ifndef STAGEHAND_NN_MODEL_OPTIONS_H_
#define STAGEHAND_NN_MODEL_OPTIONS_H_

#include <string>

#include "protos/job.pb.h"

namespace stagehand {

// A model option that turns a mechanism off (--model_option=NAME=false): unset, or any value but
// "false", leaves it on.
bool ModelOptionOn(const ModelSpec& spec, const std::string& name);

}  // namespace stagehand

#endif  // STAGEHAND_NN_MODEL_OPTIONS_H_
