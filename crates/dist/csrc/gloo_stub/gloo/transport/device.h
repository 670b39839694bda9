// flowtune declaration stub of gloo's transport/device.h: torch 2.11's ProcessGroupGloo.hpp only
// holds these types through smart pointers.
#pragma once

namespace gloo {
namespace transport {

class Device;
class UnboundBuffer;

} // namespace transport
} // namespace gloo
