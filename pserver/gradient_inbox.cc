#include "pserver/gradient_inbox.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/framework/op_desc.h"
#include "common/base/status.h"
#include "transpiler/distribute_transpiler.h"

namespace tessera {

GradientInbox::GradientInbox(const ProgramDesc* program, Scope* scope, int num_trainers,
                             bool sync, std::string endpoint,
                             std::vector<std::string> dense_grads,
                             std::map<std::string, std::pair<std::string, int64_t>> table_grads)
    : program_(program),
      scope_(scope),
      num_trainers_(num_trainers),
      sync_(sync),
      endpoint_(std::move(endpoint)),
      dense_grads_(dense_grads.begin(), dense_grads.end()),
      table_grads_(std::move(table_grads)) {
  for (int k = 0; k < num_trainers_; ++k) trainer_scopes_.push_back(scope_->NewScope());
}

absl::Status GradientInbox::CheckDeclared(const VariableHeader& h) const {
  const VarDesc* desc = FindVarDesc(program_->blocks(0), h.name);
  if (desc == nullptr) return absl::OkStatus();
  Shape want(desc->shape().begin(), desc->shape().end());
  const bool sparse = h.type == SELECTED_ROWS;
  if ((desc->type() == SELECTED_ROWS) != sparse) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient '", h.name, "' must be ", sparse ? "dense" : "sparse"));
  }
  if (h.dtype != desc->dtype()) {
    return absl::InvalidArgumentError(absl::StrCat("gradient '", h.name, "' is ",
                                                   DataTypeName(h.dtype), ", expected ",
                                                   DataTypeName(desc->dtype())));
  }
  const bool shape_ok = sparse ? (h.dims.size() == want.size() &&
                                  std::equal(h.dims.begin() + 1, h.dims.end(), want.begin() + 1))
                               : h.dims == want;
  if (!shape_ok) {
    return absl::InvalidArgumentError(absl::StrCat("gradient '", h.name, "' has shape ",
                                                   ShapeString(h.dims), ", expected ",
                                                   ShapeString(want)));
  }
  return absl::OkStatus();
}

absl::StatusOr<Variable*> GradientInbox::Prepare(const RequestMeta& meta, const VariableHeader& h,
                                                 int64_t server_step) {
  auto table = table_grads_.find(h.name);
  const bool is_table = table != table_grads_.end();
  if (is_table) {
    const auto& [table_name, dim] = table->second;
    if (h.type != SELECTED_ROWS || h.dtype != FLOAT32 || h.dims.size() != 2 || h.dims[1] != dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradient '", h.name, "' of table ", table_name, " must be float32 sparse rows of width ",
          dim, ", got ", DataTypeName(h.dtype), ShapeString(h.dims)));
    }
  } else if (dense_grads_.count(h.name) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("pserver ", endpoint_, " has no gradient variable '", h.name, "'"));
  } else {
    TS_RETURN_IF_ERROR(CheckDeclared(h));
  }
  if (sync_ && meta.step != server_step) {
    return absl::FailedPreconditionError(absl::StrCat("trainer ", meta.trainer_id, " sent '",
                                                      h.name, "' for step ", meta.step,
                                                      " but pserver is at step ", server_step));
  }
  Scope* scope = sync_ ? scope_ : trainer_scope(meta.trainer_id);
  Variable* var = scope->Var(sync_ ? TrainerGradName(h.name, meta.trainer_id) : h.name);
  if (h.type == SELECTED_ROWS) {
    SelectedRows* sr = var->GetMutable<SelectedRows>();
    sr->rows.resize(h.num_rows);
    sr->height = h.height;
    sr->value.Resize(h.dtype, h.dims);
  } else {
    Tensor* t = var->GetMutable<Tensor>();
    if (!t->initialized() || t->dtype() != h.dtype || t->shape() != h.dims) {
      t->Resize(h.dtype, h.dims);
    }
  }
  if (is_table && sync_) {
    absl::MutexLock lock(&mu_);
    table_grad_step_[{meta.trainer_id, h.name}] = meta.step;
  }
  return var;
}

absl::Status GradientInbox::CheckRows(const VariableHeader& h, Variable* var) const {
  SelectedRows* sr = var->GetIf<SelectedRows>();
  if (sr == nullptr || IsTableGradient(h.name)) return absl::OkStatus();
  const VarDesc* desc = FindVarDesc(program_->blocks(0), h.name);
  const int64_t height = desc != nullptr && desc->shape_size() > 0 ? desc->shape(0) : -1;
  for (size_t i = 0; height > 0 && i < sr->rows.size(); ++i) {
    if (sr->rows[i] >= 0 && sr->rows[i] < height) continue;
    absl::Status bad = absl::InvalidArgumentError(
        absl::StrCat("gradient '", h.name, "' has row ", sr->rows[i], " (entry ", i,
                     ") outside [0, ", height, ") on pserver ", endpoint_));
    Shape empty = h.dims;
    empty[0] = 0;
    sr->rows.clear();
    sr->value.Resize(h.dtype, empty);
    return bad;
  }
  return absl::OkStatus();
}

bool GradientInbox::Arrived(int trainer, const VariableHeader& h) {
  absl::MutexLock lock(&mu_);
  int64_t& got = bytes_[{trainer, h.name}];
  got += h.chunk_bytes;
  if (got < h.total_bytes) return false;
  got = 0;
  return true;
}

std::vector<const SelectedRows*> GradientInbox::TableGradients(const std::string& grad,
                                                               int64_t step) const {
  std::vector<const SelectedRows*> grads;
  absl::MutexLock lock(&mu_);
  for (int k = 0; k < num_trainers_; ++k) {
    auto at = table_grad_step_.find({k, grad});
    if (at == table_grad_step_.end() || at->second != step) continue;
    const Variable* v = scope_->FindVar(TrainerGradName(grad, k));
    if (v != nullptr && v->Is<SelectedRows>()) grads.push_back(&v->Get<SelectedRows>());
  }
  return grads;
}

}  // namespace tessera
