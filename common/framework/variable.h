// Variable: one named slot of a Scope, holding a dense Tensor or a SelectedRows (or nothing).
// Not thread-safe.
#ifndef TESSERA_COMMON_FRAMEWORK_VARIABLE_H_
#define TESSERA_COMMON_FRAMEWORK_VARIABLE_H_

#include <variant>

#include "common/framework/tensor.h"

namespace tessera {

class Variable {
 public:
  bool IsInitialized() const { return !std::holds_alternative<std::monostate>(value_); }
  template <typename T>
  bool Is() const {
    return std::holds_alternative<T>(value_);
  }
  // Returns the held T, replacing any value of another type with a default T.
  template <typename T>
  T* GetMutable() {
    if (!std::holds_alternative<T>(value_)) value_ = T();
    return &std::get<T>(value_);
  }
  // Precondition: Is<T>().
  template <typename T>
  const T& Get() const {
    return std::get<T>(value_);
  }
  template <typename T>
  T* GetIf() {
    return std::get_if<T>(&value_);
  }
  template <typename T>
  const T* GetIf() const {
    return std::get_if<T>(&value_);
  }
  void Clear() { value_ = std::monostate(); }
  // Exchanges the values (tensors keep their buffers: no copy).
  void Swap(Variable& other) { value_.swap(other.value_); }

 private:
  std::variant<std::monostate, Tensor, SelectedRows> value_;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_FRAMEWORK_VARIABLE_H_
