// EvalReducer: sums the trainers' evaluation partials (trainer/evaluation.h) on a pserver, so
// that a job evaluates on every trainer's share of the test data and reports one result.
//
// Trainer k sends its partial of evaluation round r as the variable "@EVAL@.<r>" (a float64
// vector, in one message or in chunks, as the client's chunk size has it); a get of "@EVAL@.<r>"
// (one per round: trainer 0's) is answered with the element-wise sum once every trainer of the job
// sent its partial of that round (at once if they already have), and the round is then forgotten. A
// trainer that left the job (Leave) is not waited for. A trainer that sends a round twice, or
// partials of different lengths, is refused with InvalidArgument naming the round.
//
// Thread-safe. Methods that complete gets return them as closures for the caller to run after
// releasing its own locks.
#ifndef TESSERA_PSERVER_EVAL_REDUCER_H_
#define TESSERA_PSERVER_EVAL_REDUCER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/rpc/server.h"
#include "common/framework/variable.h"

namespace tessera {

class EvalReducer {
 public:
  static constexpr char kPrefix[] = "@EVAL@.";
  // The largest partial accepted (values): a 2^20-bucket AUC histogram and its header.
  static constexpr int64_t kMaxValues = (int64_t{2} << 20) + 16;
  static bool IsEvalVariable(const std::string& name);
  // "@EVAL@.<round>".
  static std::string VariableName(int64_t round);

  EvalReducer(int num_trainers, std::string endpoint)
      : num_trainers_(num_trainers), endpoint_(std::move(endpoint)) {}

  // The buffer trainer `trainer`'s partial (or a chunk of it) lands in. InvalidArgument naming
  // the variable unless it is a float64 vector of 1..kMaxValues values with a round number, and
  // a chunk lies within it and agrees with the partial's earlier chunks.
  absl::StatusOr<Variable*> Prepare(int trainer, const VariableHeader& h);
  // Message `h` of a partial is in Prepare's buffer: once the partial is complete (all its bytes
  // in, and no message of it still landing), adds it into its round's sum.
  absl::Status Add(int trainer, const VariableHeader& h,
                   std::vector<std::function<void()>>* run_after);
  // Answers `done` with the round's sum when every trainer's partial is in.
  void Get(const std::string& name, RequestHandler::GetDone done,
           std::vector<std::function<void()>>* run_after);
  // Trainer `trainer` left the job without finishing (async: dropped as silent): rounds stop
  // waiting for its partial (one it already sent still counts).
  void Leave(int trainer, std::vector<std::function<void()>>* run_after);
  // Fails every waiting get with `reason`.
  void FailAll(const absl::Status& reason, std::vector<std::function<void()>>* run_after);

 private:
  struct Round {
    std::map<int, Variable> received;  // per trainer, until added
    std::map<int, int64_t> bytes;      // per trainer: bytes of its partial in so far
    // Per trainer: its messages prepared and not yet added (their bytes may still be landing in
    // `received`, which is kept until none is).
    std::map<int, int> landing;
    std::vector<bool> added;           // per trainer
    Tensor sum;
    std::vector<RequestHandler::GetDone> waiting;
  };
  // The round `name`, created with no partial added. Requires mu_.
  Round& RoundOf(const std::string& name) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Answers the round's gets and forgets it once complete. Requires mu_.
  void MaybeAnswer(const std::string& name, std::vector<std::function<void()>>* run_after)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const int num_trainers_;
  const std::string endpoint_;
  absl::Mutex mu_;
  std::map<std::string, Round> rounds_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> gone_ ABSL_GUARDED_BY(mu_);  // per trainer: left the job (Leave)
};

}  // namespace tessera

#endif  // TESSERA_PSERVER_EVAL_REDUCER_H_
