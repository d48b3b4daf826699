// NcclPlaceReducer: the PlaceReducer of a trainer whose places are GPUs of this process
// (--device=gpu --devices=0,1,...: trainer/device_setup.h). Dense gradients are summed on the
// devices with NCCL and only the sum comes to the host; everything else is combined on the host.
// Built only with --config=cuda.
//
// One NCCL communicator per device, all in this process (ncclCommInitAll: rank r drives GPU
// device_ordinals[r]). WeightedSum of dense float32 tensors that lie one on each of those GPUs
// (any order) enqueues, inside one NCCL group, on each device's stream (CudaDevice::stream(),
// so after the place's kernels that computed the value, with no host synchronization) a reduce
// with a pre-multiplying sum (ncclRedOpCreatePreMulSum: each rank scales its value by its
// place's weight; the operators live for the one call, as the weights change with the batch)
// into a fresh buffer on the GPU of values[0], then copies the sum into a fresh
// host tensor in `out` (which waits for that GPU's stream). Everything else goes to a
// CpuPlaceReducer, with its results and its errors, on host copies of the values that are on a
// device (the places' variables are left as they are): SelectedRows (their rows are
// concatenated), float64, a value on the host, on a GPU outside the list or sharing a GPU with
// another value, fewer values than GPUs (a batch smaller than the number of places), any
// mismatch of kind, dtype or shape. ConcatRows always is combined on the host.
//
// Arithmetic: CpuPlaceReducer's up to float32 rounding (NCCL applies the weights in float and
// sums in float; the CPU reducer accumulates in double).
//
// Not thread-safe: one thread calls it (PlaceRunner's); the CUDA devices it uses are.
#ifndef TESSERA_TRAINER_NCCL_PLACE_REDUCER_H_
#define TESSERA_TRAINER_NCCL_PLACE_REDUCER_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/framework/variable.h"
#include "trainer/places.h"

namespace tessera {

class NcclPlaceReducer : public PlaceReducer {
 public:
  // One communicator per GPU of `device_ordinals` (place p's GPU is device_ordinals[p]).
  // InvalidArgument for an empty list or a GPU listed twice (NCCL puts at most one rank of a
  // communicator on a GPU); FailedPrecondition naming a GPU that does not exist; Unavailable
  // with NCCL's message when ncclCommInitAll fails.
  static absl::StatusOr<std::unique_ptr<NcclPlaceReducer>> Create(std::vector<int> device_ordinals);
  // Destroys the communicators (waits for nothing: the last WeightedSum already waited).
  ~NcclPlaceReducer() override;

  NcclPlaceReducer(const NcclPlaceReducer&) = delete;
  NcclPlaceReducer& operator=(const NcclPlaceReducer&) = delete;

  // See PlaceReducer and the file comment. Besides CpuPlaceReducer's errors: Unavailable naming
  // `name` and the GPU when a CUDA or NCCL call fails, ResourceExhausted when the GPU of
  // values[0] has no memory for the sum.
  absl::Status WeightedSum(const std::string& name, const std::vector<const Variable*>& values,
                           const std::vector<double>& weights, Variable* out) override;
  // CpuPlaceReducer::ConcatRows on host copies of the values.
  absl::Status ConcatRows(const std::string& name, const std::vector<const Variable*>& values,
                          Variable* out) override;

  const std::vector<int>& device_ordinals() const { return ordinals_; }

  struct Comms;  // the NCCL communicators and CUDA devices (nccl_place_reducer.cc)

 private:
  NcclPlaceReducer(std::vector<int> ordinals, std::unique_ptr<Comms> comms);
  // The communicator rank of every value when WeightedSum can run on the devices (see the
  // file comment); empty otherwise.
  std::vector<int> DeviceRanks(const std::vector<const Variable*>& values,
                               const std::vector<double>& weights) const;

  const std::vector<int> ordinals_;
  std::unique_ptr<Comms> comms_;
  CpuPlaceReducer host_;
};

}  // namespace tessera

#endif  // TESSERA_TRAINER_NCCL_PLACE_REDUCER_H_
