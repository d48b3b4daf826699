#include "cluster/builtin_models.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/layers/model_file.h"

namespace tessera {

// Defined in builtin_models_data.cc, generated from builtin_models/*.pbtxt.
extern const char kBuiltinCtrModel[];
extern const char kBuiltinMlpRegressionModel[];
extern const char kBuiltinFashionMnistMlpModel[];
extern const char kBuiltinLenetModel[];

namespace {
struct Builtin {
  const char* name;
  const char* text;
};
constexpr Builtin kBuiltins[] = {{"ctr", kBuiltinCtrModel},
                                 {"mlp_regression", kBuiltinMlpRegressionModel},
                                 {"fashion_mnist_mlp", kBuiltinFashionMnistMlpModel},
                                 {"lenet", kBuiltinLenetModel}};
}  // namespace

std::vector<std::string> BuiltinModelNames() {
  std::vector<std::string> names;
  for (const Builtin& b : kBuiltins) names.push_back(b.name);
  return names;
}

absl::StatusOr<ModelFile> BuiltinModelFile(absl::string_view name) {
  for (const Builtin& b : kBuiltins) {
    if (name == b.name) return ParseModelText(b.text, absl::StrCat("built-in ", name));
  }
  return absl::NotFoundError(absl::StrCat("unknown example '", name, "' (known: ",
                                          absl::StrJoin(BuiltinModelNames(), ", "), ")"));
}

}  // namespace tessera
