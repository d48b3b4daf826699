#include "deploy/launch/training_plot.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/metrics/metrics_csv.h"

namespace tessera {

namespace {

// A gnuplot single-quoted string: quotes inside are doubled.
std::string Quote(const std::string& s) {
  return absl::StrCat("'", absl::StrReplaceAll(s, {{"'", "''"}}), "'");
}

}  // namespace

namespace {

// "trainer 0: held-out loss L [auc A] [accuracy C] on N examples at step S (...)".
bool ParseEvalLine(absl::string_view line, TrainingPoint* p) {
  constexpr absl::string_view kPrefix = "trainer 0: held-out ";
  if (!absl::StartsWith(line, kPrefix)) return false;
  std::vector<absl::string_view> t =
      absl::StrSplit(line.substr(kPrefix.size()), ' ', absl::SkipWhitespace());
  p->eval = true;
  p->eval_loss = p->eval_auc = p->eval_accuracy = std::nan("");
  bool has_loss = false, has_step = false;
  for (size_t i = 0; i + 1 < t.size(); ++i) {
    const absl::string_view value = absl::StripTrailingAsciiWhitespace(t[i + 1]);
    if (t[i] == "loss") has_loss = absl::SimpleAtod(value, &p->eval_loss);
    if (t[i] == "auc") absl::SimpleAtod(value, &p->eval_auc);
    if (t[i] == "accuracy") absl::SimpleAtod(value, &p->eval_accuracy);
    if (t[i] == "step") has_step = absl::SimpleAtoi(value, &p->step);
  }
  return has_loss && has_step;
}

}  // namespace

std::vector<TrainingPoint> ParseTrainingLog(absl::string_view log) {
  std::vector<TrainingPoint> out;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    TrainingPoint eval;
    if (ParseEvalLine(line, &eval)) {
      out.push_back(eval);
      continue;
    }
    std::vector<absl::string_view> t = absl::StrSplit(line, ' ', absl::SkipWhitespace());
    // "step N loss L samples/s S", optionally followed by "key value" pairs (eta, auc).
    if (t.size() < 6 || t.size() % 2 != 0 || t[0] != "step" || t[2] != "loss" ||
        t[4] != "samples/s") {
      continue;
    }
    TrainingPoint p;
    if (!absl::SimpleAtoi(t[1], &p.step) || !absl::SimpleAtod(t[3], &p.loss) ||
        !absl::SimpleAtod(absl::StripTrailingAsciiWhitespace(t[5]), &p.samples_per_s)) {
      continue;
    }
    out.push_back(p);
  }
  return out;
}

absl::Status WriteTrainingCsv(const std::vector<TrainingPoint>& points,
                              const std::string& csv_path) {
  if (std::remove(csv_path.c_str()) != 0 && errno != ENOENT) {
    return absl::UnavailableError(
        absl::StrCat("cannot replace ", csv_path, ": ", std::strerror(errno)));
  }
  auto csv = MetricsCsvWriter::Open(
      csv_path, {"step", "loss", "samples_per_s", "eval_loss", "eval_auc", "eval_accuracy"});
  if (!csv.ok()) return csv.status();
  for (const auto& p : points) {
    std::vector<std::pair<std::string, double>> row = {{"step", static_cast<double>(p.step)}};
    if (p.eval) {
      for (const auto& [name, v] : {std::make_pair("eval_loss", p.eval_loss),
                                    std::make_pair("eval_auc", p.eval_auc),
                                    std::make_pair("eval_accuracy", p.eval_accuracy)}) {
        if (!std::isnan(v)) row.emplace_back(name, v);
      }
    } else {
      row.emplace_back("loss", p.loss);
      row.emplace_back("samples_per_s", p.samples_per_s);
    }
    absl::Status s = (*csv)->Append(row);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

std::string TrainingPlotScript(const std::string& csv_path, const std::string& png_path,
                               bool log_scale_loss) {
  std::string s;
  absl::StrAppend(&s, "# Redraw with: gnuplot <this file>\n",
                  "set terminal pngcairo size 1000,700 enhanced font 'sans,10'\n", "set output ",
                  Quote(png_path), "\n", "set datafile separator ','\n",
                  "set multiplot layout 2,1 title 'Tessera training (trainer 0)'\n", "set grid\n",
                  "unset key\n", "set ylabel 'loss'\n");
  if (log_scale_loss) s += "set logscale y\n";
  absl::StrAppend(
      &s, "plot ", Quote(csv_path),
      " using 1:2 skip 1 with linespoints pt 7 ps 0.4 lc rgb '#1f77b4', ", Quote(csv_path),
      " using 1:4 skip 1 with points pt 5 ps 0.9 lc rgb '#2ca02c'\n", "unset logscale y\n",
      "set xlabel 'step'\n", "set ylabel 'samples/s'\n", "plot ", Quote(csv_path),
      " using 1:3 skip 1 with linespoints pt 7 ps 0.4 lc rgb '#d62728'\n", "unset multiplot\n");
  return s;
}

absl::Status PlotTraining(const std::string& gnuplot, const std::string& csv_path,
                          const std::string& png_path, bool log_scale_loss,
                          absl::Duration timeout) {
  std::string base =
      absl::EndsWith(png_path, ".png") ? png_path.substr(0, png_path.size() - 4) : png_path;
  std::string script_path = base + ".gnuplot";
  std::string out_path = base + ".gnuplot.out";
  {
    std::ofstream script(script_path, std::ios::trunc);
    script << TrainingPlotScript(csv_path, png_path, log_scale_loss);
    if (!script.good()) {
      return absl::UnavailableError(absl::StrCat("cannot write ", script_path));
    }
  }
  int out_fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (out_fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot create ", out_path, ": ", std::strerror(errno)));
  }
  std::remove(png_path.c_str());
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(out_fd);
    return absl::UnavailableError(absl::StrCat("fork for gnuplot: ", std::strerror(errno)));
  }
  if (pid == 0) {
    ::dup2(out_fd, STDOUT_FILENO);
    ::dup2(out_fd, STDERR_FILENO);
    ::execl(gnuplot.c_str(), gnuplot.c_str(), script_path.c_str(), static_cast<char*>(nullptr));
    static const char kMsg[] = "cannot exec gnuplot\n";
    (void)!::write(STDERR_FILENO, kMsg, sizeof(kMsg) - 1);
    _exit(127);
  }
  ::close(out_fd);
  absl::Time deadline = absl::Now() + timeout;
  int status = 0;
  bool timed_out = false;
  while (true) {
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) break;
    if (r < 0 && errno != EINTR) break;
    if (absl::Now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      timed_out = true;
      break;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
  std::ifstream in(out_path);
  std::stringstream output;
  output << in.rdbuf();
  std::remove(out_path.c_str());
  std::string said(absl::StripAsciiWhitespace(output.str()));
  absl::StrReplaceAll({{"\n", " | "}}, &said);
  if (timed_out) {
    return absl::DeadlineExceededError(absl::StrCat(gnuplot, " did not draw ", png_path, " within ",
                                                    absl::FormatDuration(timeout)));
  }
  struct stat st {};
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || ::stat(png_path.c_str(), &st) != 0 ||
      st.st_size == 0) {
    return absl::InternalError(absl::StrCat(gnuplot, " ", script_path, " did not draw ", png_path,
                                            said.empty() ? "" : ": ", said));
  }
  return absl::OkStatus();
}

std::string FindInPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  if (path == nullptr) return "";
  for (absl::string_view dir : absl::StrSplit(path, ':', absl::SkipEmpty())) {
    std::string candidate = absl::StrCat(dir, "/", name);
    struct stat st {};
    if (::stat(candidate.c_str(), &st) == 0 && S_ISREG(st.st_mode) &&
        ::access(candidate.c_str(), X_OK) == 0) {
      return candidate;
    }
  }
  return "";
}

}  // namespace tessera
