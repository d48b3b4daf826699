#include "common/layers/memory_optimize.h"

#include <algorithm>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/framework/op_desc.h"
#include "common/framework/op_registry.h"
#include "common/framework/tensor.h"

namespace tessera {

namespace {

bool IsRealArg(const std::string& name) { return !name.empty() && name != kEmptyVarName; }

bool IsGradient(absl::string_view name) {
  return IsGradVarName(name) || absl::StrContains(name, "@GRAD@");
}

bool HasBlockAttr(const OpDesc& op) {
  for (const auto& a : op.attrs()) {
    if (a.value_case() == OpDesc::Attr::kBlock) return true;
  }
  return false;
}

// Every variable an op mentions: its arguments and the values of its string attributes.
void AddMentions(const OpDesc& op, absl::flat_hash_set<std::string>* out) {
  for (const auto& slots : {&op.inputs(), &op.outputs()}) {
    for (const auto& s : *slots) {
      for (const auto& a : s.arguments()) out->insert(a);
    }
  }
  for (const auto& a : op.attrs()) {
    if (a.value_case() == OpDesc::Attr::kS) out->insert(a.s());
    if (a.value_case() == OpDesc::Attr::kStrings) {
      for (const auto& v : a.strings().v()) out->insert(v);
    }
  }
}

// Elements of one example: -1 (batch) and other unknown dims count as 1.
int64_t PerExampleElements(const VarDesc& v) {
  int64_t n = 1;
  for (int64_t d : v.shape()) n *= d < 0 ? 1 : d;
  return n;
}

bool SameLayout(const VarDesc& a, const VarDesc& b) {
  return a.dtype() == b.dtype() &&
         std::equal(a.shape().begin(), a.shape().end(), b.shape().begin(), b.shape().end());
}

// Use/def summary of one variable over block 0.
struct VarUse {
  int first_write = -1;
  int last_ref = -1;
  bool read_before_write = false;  // fed from outside the block
};

}  // namespace

absl::StatusOr<MemoryOptimizeStats> MemoryOptimize(ProgramDesc* program,
                                                   const MemoryOptimizeOptions& options) {
  if (program == nullptr) return absl::InvalidArgumentError("memory_optimize: program is null");
  if (program->blocks_size() == 0) {
    return absl::InvalidArgumentError("memory_optimize: program has no block 0");
  }

  // Variables the pass must leave alone: everything mentioned by ops with sub-blocks (live
  // throughout) and by any op outside block 0 (sub-block bodies read block 0 by name).
  absl::flat_hash_set<std::string> pinned;
  bool block0_is_sub_block = false;
  for (int b = 0; b < program->blocks_size(); ++b) {
    const BlockDesc& block = program->blocks(b);
    for (int i = 0; i < block.ops_size(); ++i) {
      const OpDesc& op = block.ops(i);
      for (const auto& a : op.attrs()) {
        if (a.value_case() != OpDesc::Attr::kBlock) continue;
        if (a.block() < 0 || a.block() >= program->blocks_size()) {
          return absl::InvalidArgumentError(
              absl::StrCat("memory_optimize: op #", i, " of block ", b, " ", OpSignature(op),
                           ": attribute '", a.name(), "' refers to block ", a.block(),
                           " but the program has ", program->blocks_size(), " blocks"));
        }
        if (a.block() == 0) block0_is_sub_block = true;
      }
      if (b != 0 || HasBlockAttr(op)) AddMentions(op, &pinned);
    }
  }
  BlockDesc* block = program->mutable_blocks(0);
  if (block0_is_sub_block) {
    for (const auto& op : block->ops()) AddMentions(op, &pinned);
  }

  // Uses and definitions, in op order; reads of an op come before its writes.
  absl::flat_hash_map<std::string, VarUse> uses;
  for (int i = 0; i < block->ops_size(); ++i) {
    const OpDesc& op = block->ops(i);
    for (const auto& name : AllInputArgs(op)) {
      if (!IsRealArg(name)) continue;
      VarUse& u = uses[name];
      if (u.first_write < 0) u.read_before_write = true;
      u.last_ref = i;
    }
    for (const auto& name : AllOutputArgs(op)) {
      if (!IsRealArg(name)) continue;
      VarUse& u = uses[name];
      if (u.first_write < 0) u.first_write = i;
      u.last_ref = i;
    }
  }

  // Candidates, with their (unique) VarDesc.
  absl::flat_hash_map<std::string, int> desc_count;
  for (const auto& v : block->vars()) ++desc_count[v.name()];
  absl::flat_hash_map<std::string, const VarDesc*> candidates;
  for (const auto& v : block->vars()) {
    const std::string& name = v.name();
    auto it = uses.find(name);
    if (it == uses.end() || it->second.first_write < 0 || it->second.read_before_write) continue;
    if (desc_count[name] != 1 || v.persistable() || v.type() != DENSE_TENSOR) continue;
    if (options.skip_vars.count(name) > 0 || pinned.contains(name)) continue;
    if (options.skip_grads && IsGradient(name)) continue;
    candidates[name] = &v;
  }

  // Linear scan over the ops: an op's newly defined candidates first take a free buffer, then the
  // candidates whose last use is this op free theirs (so an op never reads and writes one
  // buffer unless the program says so).
  MemoryOptimizeStats stats;
  stats.num_candidates = static_cast<int>(candidates.size());
  std::map<std::string, std::string> rename;  // renamed var -> buffer (slot) var
  absl::flat_hash_map<std::string, std::string> slot_of;
  std::vector<std::string> pool;  // free slots, in the order they were freed
  for (int i = 0; i < block->ops_size(); ++i) {
    const OpDesc& op = block->ops(i);
    for (const auto& name : AllOutputArgs(op)) {
      auto c = candidates.find(name);
      if (c == candidates.end() || uses[name].first_write != i || slot_of.contains(name)) continue;
      auto free = std::find_if(pool.begin(), pool.end(), [&](const std::string& slot) {
        return SameLayout(*candidates[slot], *c->second);
      });
      if (free == pool.end()) {
        slot_of[name] = name;
        continue;
      }
      slot_of[name] = *free;
      rename[name] = *free;
      stats.renames.emplace_back(name, *free);
      ++stats.vars_reused;
      stats.bytes_saved_per_example +=
          PerExampleElements(*c->second) * static_cast<int64_t>(SizeOf(c->second->dtype()));
      pool.erase(free);
    }
    absl::flat_hash_set<std::string> freed;
    for (const auto& args : {AllInputArgs(op), AllOutputArgs(op)}) {
      for (const auto& name : args) {
        if (!candidates.contains(name) || uses[name].last_ref != i) continue;
        if (freed.insert(name).second) pool.push_back(slot_of[name]);
      }
    }
  }
  if (rename.empty()) return stats;

  // Apply: a renamed variable is not mentioned before its first writer, so renaming every op is
  // renaming the later ones. op_role_var ([param, grad] pairs) follows its variables.
  auto renamed = [&](std::string* name) {
    auto it = rename.find(*name);
    if (it != rename.end()) *name = it->second;
  };
  for (auto& op : *block->mutable_ops()) {
    for (auto* slots : {op.mutable_inputs(), op.mutable_outputs()}) {
      for (auto& s : *slots) {
        for (auto& a : *s.mutable_arguments()) renamed(&a);
      }
    }
    for (auto& a : *op.mutable_attrs()) {
      if (a.name() != kOpRoleVarAttr || a.value_case() != OpDesc::Attr::kStrings) continue;
      for (auto& v : *a.mutable_strings()->mutable_v()) renamed(&v);
    }
  }
  auto* vars = block->mutable_vars();
  vars->erase(std::remove_if(vars->begin(), vars->end(),
                             [&](const VarDesc& v) { return rename.count(v.name()) > 0; }),
              vars->end());
  return stats;
}

std::string MemoryOptimizeReport(const MemoryOptimizeStats& stats) {
  constexpr size_t kMaxListed = 8;
  std::string line = absl::StrCat("memory_optimize: reused ", stats.vars_reused, " of ",
                                  stats.num_candidates, " candidate variables, saving ",
                                  stats.bytes_saved_per_example, " bytes per example");
  if (stats.renames.empty()) return line;
  std::vector<std::string> parts;
  for (size_t i = 0; i < stats.renames.size() && i < kMaxListed; ++i) {
    parts.push_back(absl::StrCat(stats.renames[i].first, "->", stats.renames[i].second));
  }
  if (stats.renames.size() > kMaxListed) {
    parts.push_back(absl::StrCat("... ", stats.renames.size() - kMaxListed, " more"));
  }
  absl::StrAppend(&line, " (", absl::StrJoin(parts, ", "), ")");
  return line;
}

}  // namespace tessera
