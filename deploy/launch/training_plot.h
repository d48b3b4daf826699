// Turns a trainer's log into data and a picture: the "step N loss L samples/s S" lines that
// trainer 0 prints become a CSV (common/metrics/metrics_csv.h) and, through gnuplot, a PNG of
// loss and throughput over steps. Used by tessera_launch at the end of a run.
#ifndef TESSERA_DEPLOY_LAUNCH_TRAINING_PLOT_H_
#define TESSERA_DEPLOY_LAUNCH_TRAINING_PLOT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tessera {

struct TrainingPoint {
  int64_t step = 0;
  double loss = 0;
  double samples_per_s = 0;
  // A held-out evaluation ("trainer 0: held-out loss L [auc A] [accuracy C] ... at step N"):
  // loss and samples_per_s unused, the eval values set (NaN where the line has none).
  bool eval = false;
  double eval_loss = 0;
  double eval_auc = 0;
  double eval_accuracy = 0;
};

// The "step N loss L samples/s S" lines and the held-out evaluation lines of a trainer log, in
// order; other lines are skipped.
std::vector<TrainingPoint> ParseTrainingLog(absl::string_view log);

// Writes `points` to `csv_path` (replacing the file) under the header
// step,loss,samples_per_s,eval_loss,eval_auc,eval_accuracy: a training point fills the first
// three, an evaluation its step and the eval columns it has. Unavailable names the file when it
// cannot be written.
absl::Status WriteTrainingCsv(const std::vector<TrainingPoint>& points,
                              const std::string& csv_path);

// The gnuplot script that draws `csv_path` (as written by WriteTrainingCsv) into `png_path`:
// loss (log scale when every loss is positive) with the held-out losses as points, above
// samples/s, both over steps.
std::string TrainingPlotScript(const std::string& csv_path, const std::string& png_path,
                               bool log_scale_loss);

// Runs `gnuplot` (a path to the binary) on TrainingPlotScript(), saved next to the PNG as
// <png without .png>.gnuplot so that the plot can be redrawn by hand. Waits at most `timeout`
// (then kills gnuplot). Errors name the PNG and carry gnuplot's own message.
absl::Status PlotTraining(const std::string& gnuplot, const std::string& csv_path,
                          const std::string& png_path, bool log_scale_loss,
                          absl::Duration timeout = absl::Seconds(30));

// The first executable file called `name` in $PATH, or "" when there is none.
std::string FindInPath(const std::string& name);

}  // namespace tessera

#endif  // TESSERA_DEPLOY_LAUNCH_TRAINING_PLOT_H_
