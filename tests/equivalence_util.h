// Helpers for tests that check distributed (or multi-place) training against single-machine
// training of the same example model: the reference run, the parameter comparison, and
// collective trainer daemons whose dumped parameters are compared.
#ifndef TESSERA_TESTS_EQUIVALENCE_UTIL_H_
#define TESSERA_TESTS_EQUIVALENCE_UTIL_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/framework/tensor.h"
#include "examples/registry.h"
#include "trainer/local_trainer.h"

namespace tessera {

using Params = std::map<std::string, Tensor>;

struct LocalRun {
  absl::Status create_status;  // of LocalTrainer::Create; nothing trained when not ok
  Params params;               // the trainable parameters after training
  std::vector<EpochStats> epochs;
};

// Trains example `eo` on one machine with `options` (its log discarded).
LocalRun TrainLocally(const examples::ExampleOptions& eo, LocalTrainerOptions options);

// Trains `model` on `train` on one machine with `options` (its log discarded).
LocalRun TrainModelLocally(const ModelSpec& model, const data::Dataset& train,
                           LocalTrainerOptions options);

// The trainable parameters after training example `eo` on one machine with batches of `batch`
// for `epochs` epochs, shuffled with `seed`.
Params SingleMachine(const examples::ExampleOptions& eo, int64_t batch, uint64_t seed,
                     int epochs);

// `got` holds the parameters of `want`, each of its shape and within relative error `rtol`
// (values below 1e-2 compared to 1e-2 * rtol absolute). Failures name `what` and the parameter.
void ExpectParamsClose(const Params& got, const Params& want, double rtol,
                       const std::string& what = "");

// The largest absolute difference between an element of a parameter of `a` and the same element
// of `b` (+inf when a parameter of `a` is missing from `b` or has another shape).
double MaxAbsDifference(const Params& a, const Params& b);

// The daemon flags of example `eo`'s data (--num_examples, --num_test_examples, --seed, and
// --vocab_per_slot for "ctr"; not --example) and of training with `batch` for `epochs`.
std::vector<std::string> ExampleFlags(const examples::ExampleOptions& eo, int64_t batch,
                                      int epochs);

// A parameter-server job of built-in example `example`: tessera_pserver and tessera_trainer
// daemons on free ports (logs <dir>/pserver.<p>.log and <dir>/trainer.<k>.log).
struct PsJob {
  std::string example = "mlp_regression";
  int pservers = 2;
  int trainers = 2;
  std::vector<std::string> flags;  // extra flags for every daemon
  // Free ports for the trainers too (--trainer_endpoints: collective rendezvous, hybrid mode).
  bool trainer_endpoints = false;
};

// Runs the job to completion (trainers bounded by 240 s, pservers by 60 s after them; every
// failure is a test failure with its log); returns trainer k's dumped parameters for every k.
std::vector<Params> RunPsJob(const PsJob& job, const std::string& dir);

// Starts `n` tessera_trainer --mode=collective daemons of job "coll" (free ports, parameters
// dumped to <dir>/params.<k>, logs in <dir>/trainer.<k>.log) with `flags`, and expects each to
// exit 0 within 120 s.
void RunCollectiveTrainers(const std::string& dir, int n, const std::vector<std::string>& flags);

// The dumped parameters <dir>/params.<k> of trainers 0..n-1 each ExpectParamsClose to `want`.
void ExpectDumpsClose(const std::string& dir, int n, const Params& want, double rtol);

}  // namespace tessera

#endif  // TESSERA_TESTS_EQUIVALENCE_UTIL_H_
