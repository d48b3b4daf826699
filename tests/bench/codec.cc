// The wire codec on the CTR job's per-step messages: one trainer's SendBatch (26 slots' deep
// (dim 8) and wide (dim 1) sparse gradients of 140 distinct ids each, plus the 7 dense blocks)
// and one PrefetchBatch answer (the 52 tables' rows). Per message: encode, then decode every
// entry into a variable, as a pserver and a trainer do. The baseline, in the same run, is plain
// protobuf on the same content (VariableBatch with the bytes set as fields, serialized and
// parsed, the bytes copied out).
//
//   bazel build //tests/bench:codec && bazel-bin/tests/bench/codec
#include "common/rpc/grpc/codec.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

namespace tessera {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

Variable Dense(int64_t rows, int64_t cols) {
  Variable v;
  Tensor* t = v.GetMutable<Tensor>();
  t->Resize(FLOAT32, {rows, cols});
  for (int64_t i = 0; i < t->numel(); ++i) t->data<float>()[i] = 0.001f * static_cast<float>(i);
  return v;
}

Variable Sparse(const std::vector<int64_t>& ids, int64_t dim) {
  Variable v;
  SelectedRows* sr = v.GetMutable<SelectedRows>();
  sr->height = 0;
  sr->rows = ids;
  sr->value.Resize(FLOAT32, {static_cast<int64_t>(ids.size()), dim});
  for (int64_t i = 0; i < sr->value.numel(); ++i) sr->value.data<float>()[i] = 0.5f;
  return v;
}

// Plain protobuf: every field set on a VariableBatch, serialized, parsed, bytes copied out.
double Protobuf(const std::vector<SendItem>& items, int reps) {
  const double t0 = Now();
  for (int r = 0; r < reps; ++r) {
    VariableBatch b;
    *b.mutable_header() = ToHeader({"job", 0, r});
    for (const SendItem& e : items) {
      VariableMessage* m = b.add_vars();
      m->set_name(e.name);
      const Tensor* value;
      if (const SelectedRows* sr = e.var->GetIf<SelectedRows>()) {
        m->set_type(SELECTED_ROWS);
        m->set_rows_data(sr->rows.data(), sr->rows.size() * sizeof(int64_t));
        value = &sr->value;
      } else {
        value = &e.var->Get<Tensor>();
      }
      for (int64_t d : value->shape()) m->add_dims(d);
      m->set_payload(value->shared_buffer().get(), value->nbytes());
    }
    const std::string wire = b.SerializeAsString();
    VariableBatch in;
    if (!in.ParseFromString(wire)) return -1;
    for (const VariableMessage& m : in.vars()) {
      Variable out;
      std::vector<int64_t> dims(m.dims().begin(), m.dims().end());
      Tensor* t;
      if (m.type() == SELECTED_ROWS) {
        SelectedRows* sr = out.GetMutable<SelectedRows>();
        sr->rows.resize(m.rows_data().size() / sizeof(int64_t));
        std::memcpy(sr->rows.data(), m.rows_data().data(), m.rows_data().size());
        t = &sr->value;
      } else {
        t = out.GetMutable<Tensor>();
      }
      t->Resize(FLOAT32, dims);
      std::memcpy(t->raw_data(), m.payload().data(), m.payload().size());
    }
  }
  return (Now() - t0) / reps;
}

double Codec(const std::vector<SendItem>& items, int reps) {
  const double t0 = Now();
  for (int r = 0; r < reps; ++r) {
    grpc::ByteBuffer wire = EncodeBatch({"job", 0, r}, items, false);
    auto batch = DecodeBatch(wire, int64_t{1} << 30);
    if (!batch.ok()) return -1;
    for (const DecodedVariable& d : batch->vars) {
      Variable out;
      if (!DecodeVariableInto(d, &out).ok()) return -1;
    }
  }
  return (Now() - t0) / reps;
}

int Run() {
  constexpr int kSlots = 26, kIds = 140, kReps = 3000;
  std::vector<Variable> vars;
  vars.reserve(2 * kSlots + 8);
  std::vector<std::string> names;
  std::vector<SendItem> send, answer;
  std::vector<Variable> rows;
  rows.reserve(2 * kSlots);
  for (int s = 0; s < kSlots; ++s) {
    std::vector<int64_t> ids(kIds);
    for (int i = 0; i < kIds; ++i) ids[i] = (int64_t{s} << 40) + i * 7919;
    vars.push_back(Sparse(ids, 8));
    vars.push_back(Sparse(ids, 1));
    rows.push_back(Dense(kIds, 8));
    rows.push_back(Dense(kIds, 1));
  }
  for (auto [r, c] : std::vector<std::pair<int64_t, int64_t>>{
           {221, 64}, {1, 64}, {64, 32}, {1, 32}, {32, 1}, {1, 1}, {13, 1}}) {
    vars.push_back(Dense(r, c));
  }
  for (size_t i = 0; i < vars.size(); ++i) {
    send.push_back({"var" + std::to_string(i) + "@GRAD", &vars[i]});
  }
  for (size_t i = 0; i < rows.size(); ++i)
    answer.push_back({"table" + std::to_string(i), &rows[i]});
  for (const auto& [what, items] : {std::make_pair("SendBatch (52 sparse + 7 dense)", &send),
                                    std::make_pair("PrefetchBatch answer (52 tables)", &answer)}) {
    Codec(*items, 200);  // warm up
    Protobuf(*items, 200);
    const double codec = Codec(*items, kReps), proto = Protobuf(*items, kReps);
    std::printf("%s: codec %.1f us, protobuf %.1f us per encode + decode (%.2fx)\n", what,
                1e6 * codec, 1e6 * proto, proto / codec);
  }
  return 0;
}

}  // namespace
}  // namespace tessera

int main() { return tessera::Run(); }
