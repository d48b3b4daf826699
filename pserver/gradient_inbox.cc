#include "pserver/gradient_inbox.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/framework/op_desc.h"
#include "common/base/status.h"
#include "transpiler/distribute_transpiler.h"

namespace tessera {

GradientInbox::GradientInbox(const ProgramDesc* program, Scope* scope, int num_trainers, bool sync,
                             std::string endpoint, std::vector<std::string> dense_grads,
                             std::map<std::string, std::pair<std::string, int64_t>> table_grads)
    : program_(program),
      scope_(scope),
      num_trainers_(num_trainers),
      sync_(sync),
      endpoint_(std::move(endpoint)) {
  for (int k = 0; k < num_trainers_; ++k) trainer_scopes_.push_back(scope_->NewScope());
  auto add = [&](const std::string& name) -> Entry& {
    Entry& e = entries_[name];
    e.declared = FindVarDesc(program_->blocks(0), name);
    e.buffer.assign(num_trainers_, nullptr);
    e.bytes.assign(num_trainers_, 0);
    e.step.assign(num_trainers_, -1);
    e.completed.assign(num_trainers_, -1);
    return e;
  };
  for (const std::string& g : dense_grads) add(g);
  for (auto& [g, table] : table_grads) {
    Entry& e = add(g);
    e.table = true;
    e.table_name = table.first;
    e.dim = table.second;
  }
}

absl::Status GradientInbox::CheckDeclared(const Entry& e, const VariableHeader& h) const {
  const VarDesc* desc = e.declared;
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
  auto found = entries_.find(h.name);
  if (found == entries_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pserver ", endpoint_, " has no gradient variable '", h.name, "'"));
  }
  Entry& e = found->second;
  if (e.table) {
    if (h.type != SELECTED_ROWS || h.dtype != FLOAT32 || h.dims.size() != 2 || h.dims[1] != e.dim) {
      return absl::InvalidArgumentError(
          absl::StrCat("gradient '", h.name, "' of table ", e.table_name,
                       " must be float32 sparse rows of width ", e.dim, ", got ",
                       DataTypeName(h.dtype), ShapeString(h.dims)));
    }
  } else {
    TS_RETURN_IF_ERROR(CheckDeclared(e, h));
  }
  if (sync_ && meta.step != server_step) {
    return absl::FailedPreconditionError(absl::StrCat("trainer ", meta.trainer_id, " sent '",
                                                      h.name, "' for step ", meta.step,
                                                      " but pserver is at step ", server_step));
  }
  const size_t k = static_cast<size_t>(meta.trainer_id);
  Variable* var;
  {
    absl::MutexLock lock(&mu_);
    var = e.buffer[k];
    if (var == nullptr) {
      Scope* scope = sync_ ? scope_ : trainer_scope(meta.trainer_id);
      var = e.buffer[k] = scope->Var(sync_ ? TrainerGradName(h.name, meta.trainer_id) : h.name);
    }
    if (e.table && sync_) e.step[k] = meta.step;
  }
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
  return var;
}

absl::Status GradientInbox::CheckRows(const VariableHeader& h, Variable* var) const {
  SelectedRows* sr = var->GetIf<SelectedRows>();
  auto found = entries_.find(h.name);
  if (sr == nullptr || found == entries_.end() || found->second.table) return absl::OkStatus();
  const VarDesc* desc = found->second.declared;
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

bool GradientInbox::Arrived(const RequestMeta& meta, const VariableHeader& h) {
  auto found = entries_.find(h.name);
  if (found == entries_.end()) return false;  // Prepare refused it
  const size_t k = static_cast<size_t>(meta.trainer_id);
  absl::MutexLock lock(&mu_);
  int64_t& got = found->second.bytes[k];
  got += h.chunk_bytes;
  if (got < h.total_bytes) return false;
  got = 0;
  if (sync_) found->second.completed[k] = meta.step;
  return true;
}

bool GradientInbox::CompleteFromAll(const std::string& grad, int64_t step,
                                    const std::set<int>& trainers) const {
  auto found = entries_.find(grad);
  if (found == entries_.end()) return false;
  absl::MutexLock lock(&mu_);
  for (int k : trainers) {
    if (k < 0 || k >= num_trainers_ || found->second.completed[static_cast<size_t>(k)] != step) {
      return false;
    }
  }
  return true;
}

std::vector<const SelectedRows*> GradientInbox::TableGradients(const std::string& grad,
                                                               int64_t step) const {
  std::vector<const SelectedRows*> grads;
  auto found = entries_.find(grad);
  if (found == entries_.end()) return grads;
  const Entry& e = found->second;
  absl::MutexLock lock(&mu_);
  for (int k = 0; k < num_trainers_; ++k) {
    if (e.step[k] != step) continue;
    const Variable* v = e.buffer[k];
    if (v != nullptr && v->Is<SelectedRows>()) grads.push_back(&v->Get<SelectedRows>());
  }
  return grads;
}

}  // namespace tessera
