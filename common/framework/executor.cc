#include "common/framework/executor.h"

#include <algorithm>

#include "absl/strings/cord.h"
#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace tessera {

namespace {
// The cause first (it names the endpoint, variable and step where it has them), then which op:
// its type, index and at most 3 inputs, so that a line stays short whatever the op's size.
absl::Status Annotate(const absl::Status& s, int index, const OpDesc& op) {
  absl::Status out(s.code(), absl::StrCat(s.message(), " (op #", index, " ", OpBrief(op), ")"));
  s.ForEachPayload(
      [&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  if (!out.GetPayload(kErrorDetailPayload).has_value()) {
    out.SetPayload(kErrorDetailPayload,
                   absl::Cord(absl::StrCat("op #", index, " ", OpSignature(op))));
  }
  return out;
}

absl::Status RunKernel(const OpInfo& info, const OpDesc& op, int index, Scope* scope,
                       const OpArgs* args = nullptr) {
  OpContext ctx(op, scope, args);
  absl::Status s = info.kernel(ctx);
  if (s.ok()) s = ctx.attr_status();
  return s.ok() ? s : Annotate(s, index, op);
}

// Ops [begin, end) of a prepared block (a valid range), with their args resolved in `scope`.
absl::Status RunResolved(const PreparedBlock& prepared, int begin, int end, Scope* scope,
                         const std::vector<OpArgs>& args) {
  const BlockDesc& block = prepared.program->blocks(prepared.block_id);
  for (int i = begin; i < end; ++i) {
    absl::Status s = RunKernel(*prepared.infos[i], block.ops(i), i, scope, &args[i]);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}
}  // namespace

void CreateBlockVariables(const BlockDesc& block, Scope* scope) {
  for (const auto& v : block.vars()) {
    if (scope->FindVar(v.name()) == nullptr) scope->Var(v.name());
  }
}

absl::StatusOr<PreparedBlock> Executor::Prepare(const ProgramDesc& program, int block_id) const {
  if (block_id < 0 || block_id >= program.blocks_size()) {
    return absl::InvalidArgumentError(absl::StrCat("program has no block ", block_id, " (it has ",
                                                   program.blocks_size(), ")"));
  }
  PreparedBlock prepared;
  prepared.program = &program;
  prepared.block_id = block_id;
  const BlockDesc& block = program.blocks(block_id);
  for (int i = 0; i < block.ops_size(); ++i) {
    const OpDesc& op = block.ops(i);
    const OpInfo* info = registry_->Find(op.type());
    if (info == nullptr) {
      return absl::NotFoundError(absl::StrCat("op #", i, " of block ", block_id,
                                              ": unknown op type '", op.type(), "'"));
    }
    prepared.infos.push_back(info);
  }
  return prepared;
}

std::pair<std::shared_ptr<const std::vector<OpArgs>>, bool> ArgCache::For(const BlockDesc& block,
                                                                           const Scope& scope) {
  absl::MutexLock lock(&mu_);
  const uint64_t version = scope.ChainVersion();
  auto it = std::find_if(entries_.begin(), entries_.end(),
                         [&](const Entry& e) { return e.scope_id == scope.id(); });
  if (it != entries_.end() && it->version == version) {
    if (it + 1 != entries_.end()) std::rotate(it, it + 1, entries_.end());
    return {entries_.back().args, true};
  }
  if (it != entries_.end()) entries_.erase(it);
  auto args = std::make_shared<std::vector<OpArgs>>();
  args->reserve(static_cast<size_t>(block.ops_size()));
  for (const OpDesc& op : block.ops()) args->push_back(ResolveOpArgs(op, scope));
  if (entries_.size() == kMaxScopes) entries_.erase(entries_.begin());
  entries_.push_back({scope.id(), version, args});
  return {std::move(args), false};
}

void Executor::CreateVariables(const PreparedBlock& prepared, Scope* scope) const {
  const BlockDesc& block = prepared.program->blocks(prepared.block_id);
  // Unchanged since the block's args were resolved here: every variable is there already.
  if (!prepared.args->For(block, *scope).second) CreateBlockVariables(block, scope);
}

absl::Status Executor::Run(const PreparedBlock& prepared, Scope* scope) const {
  const BlockDesc& block = prepared.program->blocks(prepared.block_id);
  auto [args, fresh] = prepared.args->For(block, *scope);
  if (!fresh) {  // new variables may be needed: create them, then resolve again
    CreateBlockVariables(block, scope);
    args = prepared.args->For(block, *scope).first;
  }
  return RunResolved(prepared, 0, block.ops_size(), scope, *args);
}

absl::Status Executor::RunOps(const PreparedBlock& prepared, int begin, int end,
                              Scope* scope) const {
  const BlockDesc& block = prepared.program->blocks(prepared.block_id);
  if (begin < 0 || end > block.ops_size() || begin > end) {
    return absl::InvalidArgumentError(absl::StrCat("ops [", begin, ", ", end, ") of a block of ",
                                                   block.ops_size(), " ops"));
  }
  return RunResolved(prepared, begin, end, scope, *prepared.args->For(block, *scope).first);
}

absl::Status Executor::Run(const ProgramDesc& program, int block_id, Scope* scope) const {
  auto prepared = Prepare(program, block_id);
  if (!prepared.ok()) return prepared.status();
  return Run(*prepared, scope);
}

absl::Status Executor::RunOp(const OpDesc& op, Scope* scope) const {
  const OpInfo* info = registry_->Find(op.type());
  if (info == nullptr) {
    return absl::NotFoundError(absl::StrCat("unknown op type '", op.type(), "'"));
  }
  return RunKernel(*info, op, 0, scope);
}

}  // namespace tessera
