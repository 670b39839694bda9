// flowtune declaration stub: torch's ProcessGroupGloo.hpp includes this header but uses nothing from it.
#pragma once
