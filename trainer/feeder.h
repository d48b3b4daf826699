// Feeder: turns a batch of data::Examples into the feed tensors a ModelSpec names, written into
// a Scope. Each call resizes the scope's existing tensors, so their buffers are reused from
// step to step once the largest batch has been seen.
//
// Thread-compatible: a Feeder is immutable; concurrent Feed() calls need different scopes.
#ifndef TESSERA_TRAINER_FEEDER_H_
#define TESSERA_TRAINER_FEEDER_H_

#include <cstdint>
#include <utility>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/data/example.h"
#include "common/framework/scope.h"
#include "proto/program.pb.h"
#include "common/framework/model_spec.h"

namespace tessera {

class Feeder {
 public:
  explicit Feeder(FeedSpec spec) : spec_(std::move(spec)) {}

  const FeedSpec& spec() const { return spec_; }

  // OK if every feed variable is declared in block 0 of `program` with the dtype and shape the
  // spec implies ([-1 or B, num_dense] float32, [-1, 1] int64 per slot, [-1, 1] label_dtype).
  // Otherwise InvalidArgument naming the variable, the declared and the expected shape/dtype.
  absl::Status Validate(const ProgramDesc& program) const;

  // Writes the tensors of `batch` (B >= 1 examples) into `scope`: dense [B, num_dense] float32,
  // one [B, 1] int64 per slot (ids mapped by dict_size), one [total ids, 1] int64 per multi-hot
  // slot with one sequence (Tensor::lod) per example, label [B, 1]. InvalidArgument when the
  // batch is empty or an example has the wrong number of dense values or ids, a non-finite
  // value, or an int64 label that is not a non-negative integer; the message names the
  // variable, the example and the bad value (the feed tensors' contents are then unspecified).
  absl::Status Feed(absl::Span<const data::Example> batch, Scope* scope) const;

  // As above, for the batch all[indices[0]], all[indices[1]], ... (no copy of the examples).
  // InvalidArgument if an index is outside [0, all.size()).
  absl::Status Feed(absl::Span<const data::Example> all, absl::Span<const int64_t> indices,
                    Scope* scope) const;

 private:
  template <typename GetExample>
  absl::Status FeedImpl(int64_t batch_size, const GetExample& get, Scope* scope) const;

  FeedSpec spec_;
};

// The non-negative remainder of `id` modulo `dict_size` > 0 (so -1 maps to dict_size - 1).
inline int64_t ModuloId(int64_t id, int64_t dict_size) {
  int64_t r = id % dict_size;
  return r < 0 ? r + dict_size : r;
}

}  // namespace tessera

#endif  // TESSERA_TRAINER_FEEDER_H_
