// Optimizers: Minimize(loss) = AppendBackward + one optimize op per (param, grad) pair, with the
// learning rate and per-parameter state as persistable variables initialized by startup.
// A parameter may have an optimizer of its own (SetParamOptimizer: an embedding table's); with
// clip_global_norm, one clip_by_global_norm op scales every gradient first.
//
// Sparse gradients (embedding tables with is_sparse) use the same op types; their kernels update
// only the touched rows. L2 regularization is an attribute (regularization_coeff) of each
// optimize op, applied to the gradient before the update.
#ifndef TESSERA_COMMON_LAYERS_OPTIMIZER_H_
#define TESSERA_COMMON_LAYERS_OPTIMIZER_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/layers/backward.h"
#include "common/layers/program_builder.h"
#include "common/framework/op_registry.h"

namespace tessera {

struct OptimizerOptions {
  float learning_rate = 0.01f;
  float l2_decay = 0.0f;  // L2 regularization coefficient (0 = off)
  // Exponential learning-rate decay (off when decay_steps is 0): before step t (0-based) the
  // rate is learning_rate * decay_rate^(t / decay_steps), with t / decay_steps floored when
  // staircase. Emitted as an lr_exponential_decay op with the LRSched role (the transpiler puts
  // it in its own pserver block).
  int64_t decay_steps = 0;
  float decay_rate = 1.0f;
  bool staircase = false;
  // Gradient clipping by global norm (0 = off): a clip_by_global_norm op (role Optimize, before
  // the optimize ops; the pserver transpiler keeps it on the trainer) scales every gradient by
  // clip / max(clip, norm of all gradients).
  float clip_global_norm = 0.0f;
};

// The op that clips gradients by their global norm (common/ops/optimizer_ops.h).
inline constexpr char kClipByGlobalNormOp[] = "clip_by_global_norm";

// The step counter of learning-rate schedules.
inline constexpr char kLearningRateStepVar[] = "learning_rate_step_0";

class Optimizer {
 public:
  explicit Optimizer(OptimizerOptions options) : options_(options) {}
  virtual ~Optimizer() = default;

  // Appends backward and optimize ops for `loss` (op role Optimize, op_role_var [param, grad]).
  // Returns the (param, grad) pairs.
  absl::StatusOr<std::vector<ParamGrad>> Minimize(ProgramBuilder& b, const OpRegistry& registry,
                                                  const std::string& loss);

  // `param` is updated by `optimizer` (its type, state, l2_decay; its learning rate as a
  // constant variable of its own when positive, else this optimizer's learning rate and
  // schedule). Call before Minimize.
  void SetParamOptimizer(const std::string& param, std::unique_ptr<Optimizer> optimizer) {
    per_param_[param] = std::move(optimizer);
  }

  // The op type this optimizer emits ("sgd", "momentum", "adam", "adagrad").
  virtual std::string type() const = 0;

 protected:
  // Fills `op` (Param, Grad, LearningRate already bound) with state slots and attributes,
  // creating state variables through `b`.
  virtual void AddState(ProgramBuilder& b, const VarDesc& param, OpDesc* op) = 0;

  OptimizerOptions options_;

 private:
  std::map<std::string, std::unique_ptr<Optimizer>> per_param_;
};

class SGD : public Optimizer {
 public:
  explicit SGD(OptimizerOptions options) : Optimizer(options) {}
  std::string type() const override { return "sgd"; }

 protected:
  void AddState(ProgramBuilder& b, const VarDesc& param, OpDesc* op) override {}
};

class Momentum : public Optimizer {
 public:
  Momentum(OptimizerOptions options, float mu, bool nesterov = false)
      : Optimizer(options), mu_(mu), nesterov_(nesterov) {}
  std::string type() const override { return "momentum"; }

 protected:
  void AddState(ProgramBuilder& b, const VarDesc& param, OpDesc* op) override;

 private:
  float mu_;
  bool nesterov_;
};

class Adam : public Optimizer {
 public:
  explicit Adam(OptimizerOptions options, float beta1 = 0.9f, float beta2 = 0.999f,
                float epsilon = 1e-8f)
      : Optimizer(options), beta1_(beta1), beta2_(beta2), epsilon_(epsilon) {}
  std::string type() const override { return "adam"; }

 protected:
  void AddState(ProgramBuilder& b, const VarDesc& param, OpDesc* op) override;

 private:
  float beta1_, beta2_, epsilon_;
};

class Adagrad : public Optimizer {
 public:
  explicit Adagrad(OptimizerOptions options, float epsilon = 1e-6f)
      : Optimizer(options), epsilon_(epsilon) {}
  std::string type() const override { return "adagrad"; }

 protected:
  void AddState(ProgramBuilder& b, const VarDesc& param, OpDesc* op) override;

 private:
  float epsilon_;
};

// The learning-rate variable every optimizer of a program shares.
inline constexpr char kLearningRateVar[] = "learning_rate_0";

}  // namespace tessera

#endif  // TESSERA_COMMON_LAYERS_OPTIMIZER_H_
