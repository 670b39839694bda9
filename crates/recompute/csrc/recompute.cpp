// Reentrant activation checkpointing as an autograd function: forward runs a block without
// recording a graph and keeps only its inputs; backward runs the block again with grad enabled and
// backpropagates through that fresh graph, which also accumulates the block's weight gradients.
// The block is a Rust closure, owned by the graph node (dropped with it); every C++ exception is
// turned into an error string.
#include <ATen/ATen.h>
#include <ATen/core/ivalue.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cstring>
#include <string>
#include <vector>

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

extern "C" {
// Runs the closure on `n` inputs (owned copies handed to Rust) and pushes its outputs into `sink`
// with ftr_sink_push; returns a malloc'd error message or null.
typedef char* (*ftr_call_fn)(int64_t closure, at::Tensor** inputs, int64_t n, void* sink);
typedef void (*ftr_drop_fn)(int64_t closure);
}

namespace {

// A Rust closure and how to call and drop it.
struct Closure : torch::CustomClassHolder {
  int64_t data;
  ftr_call_fn call;
  ftr_drop_fn drop;
  Closure(int64_t data, ftr_call_fn call, ftr_drop_fn drop) : data(data), call(call), drop(drop) {}
  ~Closure() override { drop(data); }

  variable_list run(const variable_list& inputs) const {
    std::vector<at::Tensor*> owned;
    owned.reserve(inputs.size());
    for (const auto& t : inputs) owned.push_back(new at::Tensor(t));
    variable_list outputs;
    char* error = call(data, owned.data(), static_cast<int64_t>(owned.size()), &outputs);
    if (error != nullptr) {
      std::string message(error);
      free(error);
      throw std::runtime_error(message);
    }
    return outputs;
  }
};

struct Recompute : public torch::autograd::Function<Recompute> {
  // `list` as a TensorList, which autograd counts as one input per tensor.
  static variable_list forward(AutogradContext* ctx, at::TensorList list,
                               c10::intrusive_ptr<Closure> closure) {
    variable_list inputs = list.vec();
    // An output nothing used gets no gradient (not zeros), so its weights get none either.
    ctx->set_materialize_grads(false);
    ctx->saved_data["closure"] = c10::IValue::make_capsule(closure);
    ctx->save_for_backward(inputs);
    at::NoGradGuard no_grad;
    return closure->run(inputs);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto closure = c10::static_intrusive_pointer_cast<Closure>(
        ctx->saved_data["closure"].toCapsule());
    variable_list inputs;
    for (const auto& t : ctx->get_saved_variables()) {
      auto d = t.detach();
      d.requires_grad_(t.requires_grad());
      inputs.push_back(d);
    }
    variable_list outputs;
    {
      at::AutoGradMode grad(true);
      outputs = closure->run(inputs);
    }
    variable_list through, seeds;
    for (size_t i = 0; i < outputs.size() && i < grads.size(); ++i) {
      if (outputs[i].requires_grad() && grads[i].defined()) {
        through.push_back(outputs[i]);
        seeds.push_back(grads[i]);
      }
    }
    if (!through.empty()) torch::autograd::backward(through, seeds);
    variable_list result;
    for (const auto& d : inputs) result.push_back(d.requires_grad() ? d.grad() : at::Tensor());
    result.emplace_back();  // the closure
    return result;
  }
};

char* copy_message(const char* what) {
  auto* out = static_cast<char*>(malloc(std::strlen(what) + 1));
  if (out != nullptr) std::strcpy(out, what);
  return out;
}

}  // namespace

extern "C" {

int ftr_grad_enabled() { return at::GradMode::is_enabled() ? 1 : 0; }

// Drops a tensor's gradient (PyTorch's `zero_grad(set_to_none=True)`), which tch cannot do.
void ftr_clear_grad(at::Tensor* t) { t->mutable_grad().reset(); }

void ftr_sink_push(void* sink, at::Tensor* t) {
  static_cast<variable_list*>(sink)->push_back(*t);
}

// Applies the checkpointed closure to `n` inputs, taking ownership of the closure (dropped with
// the graph node, or here on failure). Its outputs are written to `out` (room for `capacity`,
// count in `*n_out`) as new tensors the caller owns. Returns a malloc'd error or null.
char* ftr_recompute(int64_t closure, ftr_call_fn call, ftr_drop_fn drop, at::Tensor** inputs,
                    int64_t n, at::Tensor** out, int64_t capacity, int64_t* n_out) {
  try {
    auto holder = c10::make_intrusive<Closure>(closure, call, drop);
    variable_list in;
    for (int64_t i = 0; i < n; ++i) in.push_back(*inputs[i]);
    auto outputs = Recompute::apply(at::TensorList(in), holder);
    if (static_cast<int64_t>(outputs.size()) > capacity) {
      return copy_message("the checkpointed block returned more outputs than expected");
    }
    for (size_t i = 0; i < outputs.size(); ++i) out[i] = new at::Tensor(outputs[i]);
    *n_out = static_cast<int64_t>(outputs.size());
    return nullptr;
  } catch (const c10::Error& e) {
    return copy_message(e.what_without_backtrace());
  } catch (const std::exception& e) {
    return copy_message(e.what());
  }
}

}  // extern "C"
