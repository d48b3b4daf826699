#include "common/layers/optimizer.h"

#include "absl/strings/str_cat.h"

namespace tessera {

namespace {
Shape ShapeOf(const VarDesc& v) { return Shape(v.shape().begin(), v.shape().end()); }

// A state variable shaped like the parameter, zero-initialized, bound to slot/slot+"Out".
void AddAccumulator(ProgramBuilder& b, const VarDesc& param, absl::string_view suffix,
                    absl::string_view slot, float init, const Shape& shape, OpDesc* op) {
  std::string name = absl::StrCat(param.name(), ".", suffix);
  b.CreatePersistable(name, shape, init, param.dtype());
  SetOpInputs(op, slot, {name});
  SetOpOutputs(op, absl::StrCat(slot, "Out"), {name});
}
}  // namespace

absl::StatusOr<std::vector<ParamGrad>> Optimizer::Minimize(ProgramBuilder& b,
                                                           const OpRegistry& registry,
                                                           const std::string& loss) {
  auto pairs = AppendBackward(b.main(), registry, loss);
  if (!pairs.ok()) return pairs.status();
  int64_t saved_role = b.role();
  if (b.FindVar(kLearningRateVar) == nullptr) {
    b.CreatePersistable(kLearningRateVar, {1}, options_.learning_rate);
    if (options_.decay_steps > 0) {
      b.CreatePersistable(kLearningRateStepVar, {1}, 0.0f);
      OpDesc decay = MakeOp("lr_exponential_decay", {{"Step", {kLearningRateStepVar}}},
                            {{"Out", {kLearningRateVar}}, {"StepOut", {kLearningRateStepVar}}});
      SetAttr(&decay, "learning_rate", options_.learning_rate);
      SetAttr(&decay, "decay_rate", options_.decay_rate);
      SetAttr(&decay, "decay_steps", options_.decay_steps);
      SetAttr(&decay, "staircase", options_.staircase);
      b.set_role(kRoleLRSched);
      b.AppendOp(std::move(decay));
    }
  }
  b.set_role(kRoleOptimize);
  if (options_.clip_global_norm > 0 && !pairs->empty()) {
    std::vector<std::string> grads;
    for (const auto& pg : *pairs) grads.push_back(pg.grad);
    OpDesc clip = MakeOp(kClipByGlobalNormOp, {{"X", grads}}, {{"Out", grads}});
    SetAttr(&clip, "max_norm", options_.clip_global_norm);
    b.AppendOp(std::move(clip));
  }
  for (const auto& pg : *pairs) {
    const VarDesc param = *b.FindVar(pg.param);
    auto own = per_param_.find(pg.param);
    Optimizer& o = own == per_param_.end() ? *this : *own->second;
    std::string lr = kLearningRateVar;
    if (&o != this && o.options_.learning_rate > 0) {
      lr = absl::StrCat(pg.param, ".learning_rate");
      b.CreatePersistable(lr, {1}, o.options_.learning_rate);
    }
    OpDesc op = MakeOp(o.type(), {{"Param", {pg.param}}, {"Grad", {pg.grad}}, {"LearningRate", {lr}}},
                       {{"ParamOut", {pg.param}}});
    if (o.options_.l2_decay != 0.0f) SetAttr(&op, "regularization_coeff", o.options_.l2_decay);
    o.AddState(b, param, &op);
    SetAttr(&op, kOpRoleVarAttr, std::vector<std::string>{pg.param, pg.grad});
    b.AppendOp(std::move(op));
  }
  b.set_role(saved_role);
  return pairs;
}

void Momentum::AddState(ProgramBuilder& b, const VarDesc& param, OpDesc* op) {
  AddAccumulator(b, param, "velocity", "Velocity", 0.0f, ShapeOf(param), op);
  SetAttr(op, "mu", mu_);
  SetAttr(op, "use_nesterov", nesterov_);
}

void Adam::AddState(ProgramBuilder& b, const VarDesc& param, OpDesc* op) {
  AddAccumulator(b, param, "moment1", "Moment1", 0.0f, ShapeOf(param), op);
  AddAccumulator(b, param, "moment2", "Moment2", 0.0f, ShapeOf(param), op);
  AddAccumulator(b, param, "beta1_pow", "Beta1Pow", beta1_, {1}, op);
  AddAccumulator(b, param, "beta2_pow", "Beta2Pow", beta2_, {1}, op);
  SetAttr(op, "beta1", beta1_);
  SetAttr(op, "beta2", beta2_);
  SetAttr(op, "epsilon", epsilon_);
}

void Adagrad::AddState(ProgramBuilder& b, const VarDesc& param, OpDesc* op) {
  AddAccumulator(b, param, "moment", "Moment", 0.0f, ShapeOf(param), op);
  SetAttr(op, "epsilon", epsilon_);
}

}  // namespace tessera
