// flowtune declaration stub of gloo's context.h: only what torch 2.11's ProcessGroupGloo.hpp names.
// The shim never creates or inspects a gloo::Context (libtorch_cpu does), so declarations suffice;
// the sizeof tripwire in csrc/shim.cpp catches a torch upgrade that changes the layout.
#pragma once

#include <chrono>

namespace gloo {

class Context {
 public:
  void setTimeout(std::chrono::milliseconds timeout);
};

} // namespace gloo
