// The standard CPU op set: everything the layers API emits.
#ifndef TESSERA_COMMON_OPS_OPS_H_
#define TESSERA_COMMON_OPS_OPS_H_

#include "common/framework/op_registry.h"

namespace tessera {

// Registers every standard op family into `registry`.
absl::Status RegisterStandardOps(OpRegistry* registry);

// A registry holding just the standard ops (built once per call; cheap to keep per process).
std::unique_ptr<OpRegistry> NewStandardOpRegistry();

}  // namespace tessera

#endif  // TESSERA_COMMON_OPS_OPS_H_
