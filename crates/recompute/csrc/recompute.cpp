// Reentrant activation checkpointing as an autograd function: forward runs the block without
// recording a graph and keeps only its inputs; backward runs the block again with grad enabled and
// backpropagates through that fresh graph, which also accumulates the block's weight gradients.
// The block itself is a Rust callback; every C++ exception is turned into an error string.
#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/csrc/autograd/autograd.h>

#include <cstring>
#include <string>
#include <vector>

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

extern "C" {
// Runs the block on `n` inputs (owned copies handed to Rust) and pushes its outputs into `sink`
// with ftr_sink_push; returns a malloc'd error message or null.
typedef char* (*ftr_block_fn)(int64_t data, int64_t vtable, at::Tensor** inputs, int64_t n,
                               void* sink);
}

namespace {

variable_list run_block(int64_t callback, int64_t data, int64_t vtable,
                        const variable_list& inputs) {
  std::vector<at::Tensor*> owned;
  owned.reserve(inputs.size());
  for (const auto& t : inputs) owned.push_back(new at::Tensor(t));
  variable_list outputs;
  auto fn = reinterpret_cast<ftr_block_fn>(callback);
  char* error = fn(data, vtable, owned.data(), static_cast<int64_t>(owned.size()), &outputs);
  if (error != nullptr) {
    std::string message(error);
    free(error);
    throw std::runtime_error(message);
  }
  return outputs;
}

struct Recompute : public torch::autograd::Function<Recompute> {
  // `inputs` as a TensorList, which autograd counts as one input per tensor.
  static variable_list forward(AutogradContext* ctx, at::TensorList list, int64_t callback,
                               int64_t data, int64_t vtable) {
    variable_list inputs = list.vec();
    ctx->saved_data["callback"] = callback;
    ctx->saved_data["data"] = data;
    ctx->saved_data["vtable"] = vtable;
    ctx->save_for_backward(inputs);
    at::NoGradGuard no_grad;
    return run_block(callback, data, vtable, inputs);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    auto saved = ctx->get_saved_variables();
    variable_list inputs;
    for (const auto& t : saved) {
      auto d = t.detach();
      d.requires_grad_(t.requires_grad());
      inputs.push_back(d);
    }
    variable_list outputs;
    {
      at::AutoGradMode grad(true);
      outputs = run_block(ctx->saved_data["callback"].toInt(), ctx->saved_data["data"].toInt(),
                          ctx->saved_data["vtable"].toInt(), inputs);
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
    result.emplace_back();  // callback
    result.emplace_back();  // data
    result.emplace_back();  // vtable
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

void ftr_sink_push(void* sink, at::Tensor* t) {
  static_cast<variable_list*>(sink)->push_back(*t);
}

// Applies the checkpointed block to `n` inputs; its outputs are written to `out` (room for
// `capacity`, count in `*n_out`) as new tensors the caller owns. Returns a malloc'd error or null.
char* ftr_recompute(int64_t callback, int64_t data, int64_t vtable, at::Tensor** inputs, int64_t n,
                    at::Tensor** out, int64_t capacity, int64_t* n_out) {
  try {
    variable_list in;
    for (int64_t i = 0; i < n; ++i) in.push_back(*inputs[i]);
    auto outputs = Recompute::apply(at::TensorList(in), callback, data, vtable);
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
