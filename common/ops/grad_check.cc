#include "common/ops/grad_check.h"

#include <cmath>
#include <random>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace tessera {

namespace {

std::vector<std::string> LossOutputs(const OpDesc& op, const GradCheckOptions& options) {
  if (!options.outputs.empty()) return options.outputs;
  return {OpOutput(op, "Out")};
}

void Feed(const std::map<std::string, Tensor>& inputs, Scope* scope) {
  for (const auto& [name, t] : inputs) scope->Var(name)->GetMutable<Tensor>()->CopyFrom(t);
}

// Runs the forward op on a fresh scope and returns L = sum w * out.
absl::StatusOr<double> Loss(const Executor& exec, const OpDesc& op,
                            const std::map<std::string, Tensor>& inputs,
                            const std::vector<std::string>& outs,
                            const std::map<std::string, Tensor>& weights) {
  Scope scope;
  Feed(inputs, &scope);
  TS_RETURN_IF_ERROR(exec.RunOp(op, &scope));
  double loss = 0;
  for (const auto& name : outs) {
    const Variable* v = scope.FindVar(name);
    if (v == nullptr || !v->Is<Tensor>()) {
      return absl::InternalError(absl::StrCat("output ", name, " was not produced"));
    }
    const Tensor& t = v->Get<Tensor>();
    if (t.dtype() != FLOAT64) {
      return absl::InvalidArgumentError(absl::StrCat("output ", name, " is not float64"));
    }
    const Tensor& w = weights.at(name);
    for (int64_t i = 0; i < t.numel(); ++i) loss += t.data<double>()[i] * w.data<double>()[i];
  }
  return loss;
}

// Dense view of a gradient variable (SelectedRows are scattered into a zero tensor of `like`).
absl::StatusOr<Tensor> DenseGrad(const Variable* v, const Tensor& like, const std::string& name) {
  if (v == nullptr || !v->IsInitialized()) {
    return absl::NotFoundError(absl::StrCat("gradient ", name, " was not produced"));
  }
  if (const Tensor* t = v->GetIf<Tensor>()) return *t;
  const SelectedRows& sr = v->Get<SelectedRows>();
  Tensor dense(FLOAT64, like.shape());
  dense.SetZero();
  int64_t width = like.numel() / std::max<int64_t>(1, like.dim(0));
  for (size_t i = 0; i < sr.rows.size(); ++i) {
    for (int64_t j = 0; j < width; ++j) {
      dense.data<double>()[sr.rows[i] * width + j] += sr.value.data<double>()[i * width + j];
    }
  }
  return dense;
}

}  // namespace

Tensor RandomTensor(const Shape& shape, double lo, double hi, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> dist(lo, hi);
  Tensor t(FLOAT64, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = dist(rng);
  return t;
}

absl::Status CheckGradient(const OpRegistry& registry, const OpDesc& forward,
                           const std::map<std::string, Tensor>& inputs,
                           const GradCheckOptions& options) {
  Executor exec(&registry);
  const OpInfo* info = registry.Find(forward.type());
  if (info == nullptr || !info->grad_maker) {
    return absl::InvalidArgumentError(absl::StrCat("op ", forward.type(), " has no gradient"));
  }
  std::vector<std::string> outs = LossOutputs(forward, options);

  // Analytic gradients.
  Scope scope;
  Feed(inputs, &scope);
  TS_RETURN_IF_ERROR(exec.RunOp(forward, &scope));
  std::map<std::string, Tensor> weights;
  uint64_t seed = 1234;
  for (const auto& name : outs) {
    const Variable* v = scope.FindVar(name);
    if (v == nullptr || !v->Is<Tensor>()) {
      return absl::InternalError(absl::StrCat("output ", name, " was not produced"));
    }
    weights[name] = RandomTensor(v->Get<Tensor>().shape(), -1.0, 1.0, seed++);
    scope.Var(GradVarName(name))->GetMutable<Tensor>()->CopyFrom(weights[name]);
  }
  for (const OpDesc& g : info->grad_maker(forward)) {
    OpDesc pruned = g;  // drop outputs nobody checks, as AppendBackward does
    for (auto& slot : *pruned.mutable_outputs()) {
      for (auto& a : *slot.mutable_arguments()) {
        bool wanted = false;
        for (const auto& w : options.wrt) wanted |= (a == GradVarName(w));
        if (!wanted && IsGradVarName(a)) a = kEmptyVarName;
      }
    }
    TS_RETURN_IF_ERROR(exec.RunOp(pruned, &scope));
  }

  for (const auto& name : options.wrt) {
    auto it = inputs.find(name);
    if (it == inputs.end()) return absl::InvalidArgumentError(absl::StrCat("no input ", name));
    TS_ASSIGN_OR_RETURN(Tensor analytic,
                        DenseGrad(scope.FindVar(GradVarName(name)), it->second, GradVarName(name)));
    if (analytic.shape() != it->second.shape()) {
      return absl::InternalError(absl::StrCat("gradient of ", name, " has shape ",
                                              ShapeString(analytic.shape()), ", input has ",
                                              ShapeString(it->second.shape())));
    }
    for (int64_t i = 0; i < it->second.numel(); ++i) {
      std::map<std::string, Tensor> plus = inputs, minus = inputs;
      plus[name] = it->second.Clone();
      minus[name] = it->second.Clone();
      plus[name].data<double>()[i] += options.delta;
      minus[name].data<double>()[i] -= options.delta;
      TS_ASSIGN_OR_RETURN(double lp, Loss(exec, forward, plus, outs, weights));
      TS_ASSIGN_OR_RETURN(double lm, Loss(exec, forward, minus, outs, weights));
      double numeric = (lp - lm) / (2 * options.delta);
      double a = analytic.data<double>()[i];
      if (std::fabs(a - numeric) > options.atol + options.rtol * std::fabs(numeric)) {
        return absl::InternalError(absl::StrCat(forward.type(), ": d loss / d ", name, "[", i,
                                                "] analytic ", a, " vs numeric ", numeric));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace tessera
