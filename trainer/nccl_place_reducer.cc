#include "trainer/nccl_place_reducer.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/device/cuda/cuda_device.h"
#include "common/device/placement.h"
#include "common/base/status.h"

namespace tessera {

struct NcclPlaceReducer::Comms {
  std::vector<ncclComm_t> comms;     // rank r drives GPU ordinals_[r]
  std::vector<CudaDevice*> devices;  // the same GPUs (their streams order all the work)
};

namespace {

absl::Status NcclFailure(const std::string& what, ncclResult_t r, ncclComm_t comm) {
  std::string detail = ncclGetErrorString(r);
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && *last != '\0') absl::StrAppend(&detail, ": ", last);
  }
  return absl::UnavailableError(absl::StrCat(what, ": NCCL error ", detail));
}

std::string What(const std::string& name, int device) {
  return absl::StrCat("combining '", name, "' across places on GPU ", device);
}

bool OnDevice(const Variable& v) {
  if (const Tensor* t = v.GetIf<Tensor>()) return !t->place().is_cpu();
  if (const SelectedRows* sr = v.GetIf<SelectedRows>()) return !sr->value.place().is_cpu();
  return false;
}

// The values as the CPU reducer needs them: those on a device replaced by host copies (the
// places' variables keep their device buffers), the others as they are. status() is the first
// device failure copying them (then values() must not be used).
class HostValues {
 public:
  explicit HostValues(const std::vector<const Variable*>& values) {
    copies_.reserve(values.size());
    for (const Variable* v : values) {
      if (v == nullptr || !OnDevice(*v)) {
        values_.push_back(v);
        continue;
      }
      // A handle copy shares the device buffers; MoveToPlace gives the copy host buffers of
      // its own (copying the bytes, after the device's work on them) and leaves `v` alone.
      auto copy = std::make_unique<Variable>(*v);
      status_ = MoveToPlace(copy.get(), Place::Cpu());
      if (!status_.ok()) return;
      values_.push_back(copy.get());
      copies_.push_back(std::move(copy));
    }
  }
  const std::vector<const Variable*>& values() const { return values_; }
  const absl::Status& status() const { return status_; }

 private:
  absl::Status status_;
  std::vector<std::unique_ptr<Variable>> copies_;
  std::vector<const Variable*> values_;
};

}  // namespace

NcclPlaceReducer::NcclPlaceReducer(std::vector<int> ordinals, std::unique_ptr<Comms> comms)
    : ordinals_(std::move(ordinals)), comms_(std::move(comms)) {}

NcclPlaceReducer::~NcclPlaceReducer() {
  for (ncclComm_t comm : comms_->comms) {
    if (comm != nullptr) ncclCommDestroy(comm);
  }
}

absl::StatusOr<std::unique_ptr<NcclPlaceReducer>> NcclPlaceReducer::Create(
    std::vector<int> device_ordinals) {
  if (device_ordinals.empty()) {
    return absl::InvalidArgumentError("NcclPlaceReducer: no GPUs to reduce across");
  }
  std::set<int> seen;
  for (int d : device_ordinals) {
    if (!seen.insert(d).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("NcclPlaceReducer: GPU ", d, " is listed twice (GPUs ",
                       absl::StrJoin(device_ordinals, ","),
                       "); NCCL puts at most one rank of a communicator on a GPU"));
    }
  }
  auto comms = std::make_unique<Comms>();
  for (int d : device_ordinals) {
    TS_ASSIGN_OR_RETURN(CudaDevice * dev, CudaDevice::Get(d));
    comms->devices.push_back(dev);
  }
  comms->comms.assign(device_ordinals.size(), nullptr);
  const ncclResult_t r = ncclCommInitAll(
      comms->comms.data(), static_cast<int>(device_ordinals.size()), device_ordinals.data());
  if (r != ncclSuccess) {
    return NcclFailure(absl::StrCat("NcclPlaceReducer: ncclCommInitAll on GPUs ",
                                    absl::StrJoin(device_ordinals, ",")),
                       r, nullptr);
  }
  return std::unique_ptr<NcclPlaceReducer>(
      new NcclPlaceReducer(std::move(device_ordinals), std::move(comms)));
}

std::vector<int> NcclPlaceReducer::DeviceRanks(const std::vector<const Variable*>& values,
                                               const std::vector<double>& weights) const {
  if (values.size() != ordinals_.size() || weights.size() != values.size()) return {};
  std::vector<int> ranks;
  std::vector<bool> taken(ordinals_.size(), false);
  const Tensor* first = nullptr;
  for (const Variable* v : values) {
    const Tensor* t = v == nullptr ? nullptr : v->GetIf<Tensor>();
    if (t == nullptr || !t->initialized() || t->dtype() != FLOAT32 || t->numel() == 0 ||
        !t->place().is_gpu() || (first != nullptr && t->shape() != first->shape())) {
      return {};
    }
    if (first == nullptr) first = t;
    int rank = -1;
    for (size_t r = 0; r < ordinals_.size(); ++r) {
      if (ordinals_[r] == t->place().device) rank = static_cast<int>(r);
    }
    if (rank < 0 || taken[static_cast<size_t>(rank)]) return {};
    taken[static_cast<size_t>(rank)] = true;
    ranks.push_back(rank);
  }
  return ranks;
}

absl::Status NcclPlaceReducer::WeightedSum(const std::string& name,
                                           const std::vector<const Variable*>& values,
                                           const std::vector<double>& weights, Variable* out) {
  const std::vector<int> ranks = DeviceRanks(values, weights);
  if (ranks.empty()) {
    HostValues host(values);
    TS_RETURN_IF_ERROR(host.status());
    return host_.WeightedSum(name, host.values(), weights, out);
  }
  const Tensor& first = values[0]->Get<Tensor>();
  const size_t count = static_cast<size_t>(first.numel());
  const int root = ranks[0];
  CudaDevice* root_device = comms_->devices[static_cast<size_t>(root)];
  // A fresh device buffer for the sum (never a place's tensor), stream-ordered on the root GPU.
  std::shared_ptr<char> sum = root_device->Allocate(first.nbytes());
  if (sum == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat(
        What(name, root_device->ordinal()), ": out of memory for ", first.nbytes(), " bytes"));
  }
  // Each rank's operator: a sum that first multiplies the rank's value by its place's weight.
  const size_t n = ranks.size();
  std::vector<ncclRedOp_t> ops(n);
  std::vector<bool> created(n, false);
  absl::Status status;
  for (size_t i = 0; i < n && status.ok(); ++i) {
    const size_t r = static_cast<size_t>(ranks[i]);
    float w = static_cast<float>(weights[i]);
    const ncclResult_t res = ncclRedOpCreatePreMulSum(&ops[i], &w, ncclFloat32,
                                                      ncclScalarHostImmediate, comms_->comms[r]);
    if (res != ncclSuccess) {
      status = NcclFailure(absl::StrCat(What(name, ordinals_[r]), ": ncclRedOpCreatePreMulSum"),
                           res, comms_->comms[r]);
    } else {
      created[i] = true;
    }
  }
  if (status.ok()) {
    // One group: a single thread drives every rank of the clique.
    ncclResult_t res = ncclGroupStart();
    if (res != ncclSuccess) {
      status = NcclFailure(absl::StrCat(What(name, root_device->ordinal()), ": ncclGroupStart"),
                           res, nullptr);
    } else {
      for (size_t i = 0; i < n; ++i) {
        const size_t r = static_cast<size_t>(ranks[i]);
        res = ncclReduce(values[i]->Get<Tensor>().raw_data(),
                         static_cast<int>(r) == root ? sum.get() : nullptr, count, ncclFloat32,
                         ops[i], root, comms_->comms[r], comms_->devices[r]->stream());
        if (res != ncclSuccess && status.ok()) {
          status = NcclFailure(absl::StrCat(What(name, ordinals_[r]), ": ncclReduce"), res,
                               comms_->comms[r]);
        }
      }
      res = ncclGroupEnd();  // always, to close the group
      if (res != ncclSuccess && status.ok()) {
        status = NcclFailure(absl::StrCat(What(name, root_device->ordinal()), ": ncclGroupEnd"),
                             res, comms_->comms[static_cast<size_t>(root)]);
      }
    }
  }
  // The operators may go as soon as the calls using them returned.
  for (size_t i = 0; i < n; ++i) {
    if (created[i]) ncclRedOpDestroy(ops[i], comms_->comms[static_cast<size_t>(ranks[i])]);
  }
  TS_RETURN_IF_ERROR(status);
  // The rest of the program runs on the host: the sum goes into a fresh host tensor (waiting
  // for the root GPU's stream, hence for the reduce).
  Tensor host(FLOAT32, first.shape());
  absl::Status copied = root_device->CopyToHost(host.raw_data(), sum.get(), first.nbytes());
  if (!copied.ok()) {
    return absl::UnavailableError(
        absl::StrCat(What(name, root_device->ordinal()), ": ", copied.message()));
  }
  *out->GetMutable<Tensor>() = std::move(host);
  return absl::OkStatus();
}

absl::Status NcclPlaceReducer::ConcatRows(const std::string& name,
                                          const std::vector<const Variable*>& values,
                                          Variable* out) {
  HostValues host(values);
  TS_RETURN_IF_ERROR(host.status());
  return host_.ConcatRows(name, host.values(), out);
}

}  // namespace tessera
