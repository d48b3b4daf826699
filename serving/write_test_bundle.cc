// write_test_bundle DIR: writes DIR/bundle/export-0000000042 (serving/test_bundle.h's model,
// with its table on one pserver) and DIR/data.csv (200 labelled examples it can score: 40
// exported ids, 10 ids never exported), for predict_cli_test.sh. Exit status 1 on any error.
#include <cstdio>
#include <string>
#include <vector>

#include "common/framework/executor.h"
#include "common/io/file_system.h"
#include "common/ops/ops.h"
#include "serving/test_bundle.h"

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: write_test_bundle DIR\n");
    return 1;
  }
  const std::string dir = argv[1];
  tessera::io::FileSystem* fs = tessera::io::PosixFileSystem::Default();
  auto registry = tessera::NewStandardOpRegistry();
  tessera::TestModelOptions mo;
  const tessera::ModelSpec model = tessera::BuildTestModel(mo);
  tessera::Scope params;
  absl::Status s = tessera::Executor(registry.get()).Run(model.startup, 0, &params);
  auto table = tessera::MakeTestTable(mo.vocab, mo.dim);
  if (s.ok()) s = table.status();
  if (s.ok()) {
    s = tessera::WriteTestBundle(fs, tessera::io::JoinPath(dir, "bundle"), model, params,
                                 table->get(), tessera::TestBundleOptions{})
            .status();
  }
  if (s.ok()) {
    std::vector<int64_t> ids;
    for (int64_t id = 0; id < mo.vocab + 10; ++id) ids.push_back(id);
    s = tessera::io::WriteFileAtomic(fs, tessera::io::JoinPath(dir, "data.csv"),
                                     tessera::TestDataCsv(tessera::MakeTestData(200, ids, 3)));
  }
  if (!s.ok()) {
    std::fprintf(stderr, "write_test_bundle: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}
