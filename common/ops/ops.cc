#include "common/ops/ops.h"

#include "common/ops/activation_ops.h"
#include "common/ops/basic_ops.h"
#include "common/ops/dist_ops.h"
#include "common/ops/embedding_ops.h"
#include "common/ops/loss_ops.h"
#include "common/ops/math_ops.h"
#include "common/ops/nn_ops.h"
#include "common/ops/optimizer_ops.h"
#include "common/ops/random_ops.h"
#include "common/ops/sequence_ops.h"
#include "common/ops/tensor_ops.h"
#include "common/base/status.h"

#include <cstdio>
#include <cstdlib>

namespace tessera {

absl::Status RegisterStandardOps(OpRegistry* r) {
  TS_RETURN_IF_ERROR(RegisterBasicOps(r));
  TS_RETURN_IF_ERROR(RegisterMathOps(r));
  TS_RETURN_IF_ERROR(RegisterActivationOps(r));
  TS_RETURN_IF_ERROR(RegisterLossOps(r));
  TS_RETURN_IF_ERROR(RegisterTensorOps(r));
  TS_RETURN_IF_ERROR(RegisterRandomOps(r));
  TS_RETURN_IF_ERROR(RegisterEmbeddingOps(r));
  TS_RETURN_IF_ERROR(RegisterSequenceOps(r));
  TS_RETURN_IF_ERROR(RegisterOptimizerOps(r));
  TS_RETURN_IF_ERROR(RegisterDistOps(r));
  TS_RETURN_IF_ERROR(RegisterNnOps(r));
  return absl::OkStatus();
}

std::unique_ptr<OpRegistry> NewStandardOpRegistry() {
  auto r = std::make_unique<OpRegistry>();
  absl::Status s = RegisterStandardOps(r.get());
  if (!s.ok()) {  // only a duplicate registration can fail: a programming error
    std::fprintf(stderr, "tessera: standard op registration failed: %s\n", s.ToString().c_str());
    std::abort();
  }
  return r;
}

}  // namespace tessera
