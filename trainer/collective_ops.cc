#include "trainer/collective_ops.h"

#include "absl/strings/str_cat.h"
#include "common/collective/reducer.h"
#include "common/base/status.h"

namespace tessera {

namespace {

absl::StatusOr<collective::Communicator*> World(CollectiveState* state, const OpContext& ctx) {
  if (!state->context.IsInitialized()) {
    return ctx.Error("the collective context is not initialized (c_comm_init has not run)");
  }
  return state->context.world();
}

// Dense view of a gradient: a SelectedRows is scattered into a zero [height, width] tensor that
// replaces it in the variable.
absl::StatusOr<Tensor*> DenseGradient(const OpContext& ctx, Variable* v, const std::string& name) {
  if (Tensor* t = v->GetIf<Tensor>()) return t;
  const SelectedRows* sr = v->GetIf<SelectedRows>();
  if (sr == nullptr) return ctx.Error(absl::StrCat("gradient '", name, "' is empty"));
  if (sr->height <= 0) {
    return ctx.Error(absl::StrCat("sparse gradient '", name,
                                  "' has no height (a distributed table?) and cannot be made "
                                  "dense for collective mode"));
  }
  const int64_t width = sr->value.rank() > 1 ? sr->value.numel() / sr->value.dim(0) : 1;
  Tensor dense(FLOAT32, {sr->height, width});
  dense.SetZero();
  for (size_t i = 0; i < sr->rows.size(); ++i) {
    int64_t r = sr->rows[i];
    if (r < 0 || r >= sr->height) {
      return ctx.Error(
          absl::StrCat("sparse gradient '", name, "' row ", r, " outside [0, ", sr->height, ")"));
    }
    for (int64_t j = 0; j < width; ++j) {
      dense.data<float>()[r * width + j] += sr->value.data<float>()[i * width + j];
    }
  }
  *v->GetMutable<Tensor>() = dense;
  return v->GetMutable<Tensor>();
}

// The step's gradient `name`, made dense, for an all-reduce.
absl::StatusOr<Tensor*> ComputedGradient(const OpContext& ctx, const std::string& name) {
  Variable* v = ctx.scope()->FindVar(name);
  if (v == nullptr) return ctx.Error(absl::StrCat("gradient '", name, "' was not computed"));
  return DenseGradient(ctx, v, name);
}

}  // namespace

absl::Status RegisterCollectiveOps(OpRegistry* registry, CollectiveState* state) {
  TS_RETURN_IF_ERROR(registry->Register(
      "c_comm_init", {[state](OpContext& ctx) -> absl::Status {
                        if (state->context.IsInitialized()) return absl::OkStatus();
                        absl::Status s = state->context.Init(state->method, state->rank,
                                                             state->world_size, state->params);
                        if (!s.ok()) {
                          return absl::Status(
                              s.code(), absl::StrCat("collective rendezvous at ",
                                                     state->params.endpoint, ": ", s.message()));
                        }
                        return absl::OkStatus();
                      },
                      nullptr}));
  TS_RETURN_IF_ERROR(registry->Register(
      "c_broadcast", {[state](OpContext& ctx) -> absl::Status {
                        TS_ASSIGN_OR_RETURN(collective::Communicator * world, World(state, ctx));
                        std::vector<Tensor*> tensors;
                        int n = static_cast<int>(OpOutputs(ctx.op(), "Out").size());
                        for (int i = 0; i < n; ++i) {
                          TS_ASSIGN_OR_RETURN(Tensor * t, ctx.Output("Out", i));
                          tensors.push_back(t);
                        }
                        return collective::BroadcastParameters(world, tensors, 0);
                      },
                      nullptr}));
  TS_RETURN_IF_ERROR(registry->Register(
      "c_allreduce_mean",
      {[state](OpContext& ctx) -> absl::Status {
         TS_ASSIGN_OR_RETURN(collective::Communicator * world, World(state, ctx));
         auto names = OpInputs(ctx.op(), "X");
         std::vector<Tensor*> tensors;
         for (const std::string& name : names) {
           TS_ASSIGN_OR_RETURN(Tensor * t, ComputedGradient(ctx, name));
           tensors.push_back(t);
         }
         collective::MultiReduceOptions options = state->reduce;
         const collective::Compression kind = options.compression.kind;
         if (kind == collective::Compression::kTopK ||
             kind == collective::Compression::kThreshold) {
           options.coalesce = true;
           options.error_feedback = &state->feedback;
         }
         const int64_t before = world->stats().bytes_sent();
         absl::Status s = collective::AllReduceMultiple(world, tensors, options);
         state->gradient_bytes += world->stats().bytes_sent() - before;
         return s;
       },
       nullptr}));
  TS_RETURN_IF_ERROR(registry->Register(
      "c_allreduce_start",
      {[state](OpContext& ctx) -> absl::Status {
         TS_ASSIGN_OR_RETURN(collective::Communicator * world, World(state, ctx));
         const collective::Compression kind = state->reduce.compression.kind;
         if (kind != collective::Compression::kNone && kind != collective::Compression::kFp16) {
           return ctx.Error("the overlapped all-reduce is uncompressed or fp16 (top-k and "
                            "threshold need c_allreduce_mean's error feedback)");
         }
         if (state->reducer == nullptr) {
           collective::CoalescingReducerOptions options;
           options.compression = state->reduce.compression;
           options.bucket_bytes = state->bucket_bytes;
           state->reducer_bytes_before = world->stats().bytes_sent();
           state->reducer = std::make_unique<collective::CoalescingReducer>(world, options);
         }
         TS_ASSIGN_OR_RETURN(Tensor * t, ComputedGradient(ctx, OpInput(ctx.op(), "X")));
         return state->reducer->Add(t);
       },
       nullptr}));
  TS_RETURN_IF_ERROR(registry->Register(
      "c_allreduce_wait",
      {[state](OpContext& ctx) -> absl::Status {
         TS_ASSIGN_OR_RETURN(collective::Communicator * world, World(state, ctx));
         if (state->reducer == nullptr) {
           return ctx.Error("no c_allreduce_start ran this step");
         }
         absl::Status s = state->reducer->Finalize();
         state->reducer.reset();
         state->gradient_bytes += world->stats().bytes_sent() - state->reducer_bytes_before;
         return s;
       },
       nullptr}));
  return absl::OkStatus();
}

}  // namespace tessera
